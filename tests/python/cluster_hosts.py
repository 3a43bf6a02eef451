"""N "hosts" on this machine for the partitioned-cache tests: each host is a network namespace with its own
address on a bridge, its links shaped by ``tc netem`` (bandwidth and latency), created and torn down by the
test. Optionally the bridge also has an address in the root namespace for "remote storage" (an S3 server run
there), and the storage link into each host is shaped separately (``tc htb``: storage's class at
``storage_rate``, everything else at ``rate``). Where namespaces are not permitted (not root, no ``ip netns``),
the fallback is one loopback address per host (127.0.0.2, 127.0.0.3, ...) with no shaping; ``Hosts.mode`` says
which ran. ``UNSTALL_TEST_HOSTS``
forces one (``netns`` or ``loopback``). A module of its own (never ``from conftest import``)."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Optional, Sequence

__all__ = ["Hosts", "netns_permitted", "make_cluster_certificate"]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"'ip {' '.join(args)}' failed ({done.returncode}): {done.stderr.strip()}")
    return done


_instances = itertools.count()


def netns_permitted() -> bool:
    """Whether this process may create network namespaces (root with iproute2): probes with a throwaway one."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    probe = f"unstall-probe-{os.getpid()}"
    if _ip("netns", "add", probe, check=False).returncode != 0:
        return False
    _ip("netns", "del", probe, check=False)
    return True


class Hosts:
    """``n`` hosts joined by a bridge (``mode == "netns"``) or loopback addresses (``"loopback"``).

    ``rate`` and ``delay`` shape every host's egress (netem; tbf, bandwidth only, where the kernel lacks
    netem): a link between two hosts carries both ends' shaping, as two NICs would. With ``storage_rate``,
    ``storage_address`` (the bridge's address in the root namespace) is where a storage server listens, and
    what it sends into each host is shaped to ``storage_rate`` (per host, as each node's link to remote storage)
    while peer traffic keeps ``rate``. ``command(k, argv)`` runs argv on host k."""

    def __init__(self, n: int, rate: str = "1gbit", delay: str = "1ms", mode: Optional[str] = None,
                 storage_rate: Optional[str] = None) -> None:
        wanted = mode or os.environ.get("UNSTALL_TEST_HOSTS") or ("netns" if netns_permitted() else "loopback")
        if wanted not in ("netns", "loopback"):
            raise ValueError(f"UNSTALL_TEST_HOSTS must be netns or loopback, not {wanted!r}")
        self.n = n
        self.mode = wanted
        self.rate = rate
        self.delay = delay
        tag = (os.getpid() * 10 + next(_instances)) % 100000  # unique per instance: names are global
        self._bridge = f"ubr{tag}"
        self._ns = [f"unstall-{tag}-{k}" for k in range(n)]
        self._veth = [(f"uh{tag}x{k}", f"un{tag}x{k}") for k in range(n)]
        # A /24 of 10.0.0.0/8 per test process, so concurrent runs on one machine do not collide.
        net = f"10.{200 + tag % 50}.{tag // 50 % 250}"
        if self.mode == "netns":
            self.addresses = [f"{net}.{k + 1}" for k in range(n)]
            self.storage_address = f"{net}.254"
        else:
            self.addresses = [f"127.0.0.{k + 2}" for k in range(n)]
            self.storage_address = "127.0.0.1"
        self.storage_rate = storage_rate
        self._created: list[Sequence[str]] = []  # teardown commands, run in reverse
        self.shaping = "none"

    def __enter__(self) -> Hosts:
        if self.mode == "netns":
            try:
                self._create()
            except BaseException:
                self.close()
                raise
        return self

    def _create(self) -> None:
        _ip("link", "add", self._bridge, "type", "bridge")
        self._created.append(("link", "del", self._bridge))
        _ip("link", "set", self._bridge, "up")
        if self.storage_rate:
            _ip("addr", "add", f"{self.storage_address}/24", "dev", self._bridge)
        for k in range(self.n):
            ns, (host_end, ns_end) = self._ns[k], self._veth[k]
            _ip("netns", "add", ns)
            self._created.append(("netns", "del", ns))  # deleting the namespace deletes its veth pair
            _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            self._created.append(("link", "del", host_end))  # else it lingers while the namespace goes
            _ip("link", "set", ns_end, "netns", ns)
            _ip("link", "set", host_end, "master", self._bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.addresses[k]}/24", "dev", ns_end)
            _ip("-n", ns, "link", "set", ns_end, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            self._shape(ns, ns_end)
            if self.storage_rate:
                self._shape_storage(host_end)

    def _shape(self, ns: str, dev: str) -> None:
        """netem (bandwidth and latency) where the kernel has it; else tbf, bandwidth only (``shaping`` says)."""
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root"]
        netem = subprocess.run([*tc, "netem", "delay", self.delay, "rate", self.rate], capture_output=True, text=True)
        if netem.returncode == 0:
            self.shaping = f"netem rate {self.rate} delay {self.delay}"
            return
        subprocess.run([*tc, "tbf", "rate", self.rate, "burst", "64kb", "latency", "50ms"], check=True,
                       capture_output=True, text=True)
        self.shaping = f"tbf rate {self.rate}, no added latency (no sch_netem: {netem.stderr.strip()})"

    def _shape_storage(self, host_end: str) -> None:
        """Into the host (the root side's egress): storage's packets at ``storage_rate``, the rest at ``rate``."""
        tc = ["tc"]
        for args in (["qdisc", "add", "dev", host_end, "root", "handle", "1:", "htb", "default", "20"],
                     ["class", "add", "dev", host_end, "parent", "1:", "classid", "1:10", "htb", "rate",
                      self.storage_rate, "ceil", self.storage_rate],
                     ["class", "add", "dev", host_end, "parent", "1:", "classid", "1:20", "htb", "rate", self.rate],
                     ["filter", "add", "dev", host_end, "parent", "1:", "protocol", "ip", "u32", "match", "ip", "src",
                      f"{self.storage_address}/32", "flowid", "1:10"]):
            subprocess.run([*tc, *args], check=True, capture_output=True, text=True)

    def command(self, k: int, argv: Sequence[str]) -> list[str]:
        """argv as run on host k: inside its namespace, or as is on the loopback fallback."""
        if self.mode == "netns":
            return ["ip", "netns", "exec", self._ns[k], *argv]
        return list(argv)

    def describe(self) -> str:
        if self.mode == "netns":
            storage = (f"; storage at {self.storage_address} (root namespace), its link into each host shaped by "
                       f"htb rate {self.storage_rate}" if self.storage_rate else "")
            return f"{self.n} network namespaces on bridge {self._bridge}, links shaped by {self.shaping}{storage}"
        return f"{self.n} loopback addresses {', '.join(self.addresses)} (no namespaces: unshaped)"

    def close(self) -> None:
        for args in reversed(self._created):
            _ip(*args, check=False)
        self._created.clear()

    def __exit__(self, t: Optional[type[BaseException]], e: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.close()


def make_cluster_certificate(directory: Path, addresses: Sequence[str]) -> tuple[Path, Path]:
    """A self-signed certificate for every host address (it is also the cluster's CA): (cert, key)."""
    cert, key = directory / "cluster-cert.pem", directory / "cluster-key.pem"
    san = ",".join(f"IP:{a}" for a in addresses)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=unstall-cluster", "-addext", f"subjectAltName={san}", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    key.chmod(0o600)
    return cert, key
