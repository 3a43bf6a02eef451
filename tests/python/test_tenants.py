"""Tenants: the owner issues tokens that read granted datasets over Flight and nothing else; the control
plane stays the owner's, and refuses anything beyond its entry point's methods (no reflection)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from py4j.java_gateway import GatewayParameters, JavaGateway
from py4j.protocol import Py4JError

import unstall
from unstall.client import FlightClient
from unstall.local import LocalClient
from unstall.protocol import encode_fetch_ticket
from unstall.torch import DataLoader, Dataset
from batches import keep
from datagen import make_image_folder
from waits import wait_until

NOBODY = 65534


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, seed in (("granted-ds", 1), ("secret-ds", 2)):
        root = tmp_path_factory.mktemp(name)
        make_image_folder(root, ["a", "b"], per_class=3, seed=seed, extras=False)
        out[name] = root
    return out


@pytest.fixture(scope="module")
def owner(start_sidecar, roots: dict[str, Path]) -> unstall.Sidecar:
    s = start_sidecar("16MiB")
    for name, root in roots.items():
        s.register_dataset(name, root)
    return s


def _tenant(owner: unstall.Sidecar, token: str, tmp_path: Path) -> unstall.Sidecar:
    """What a tenant has: the address and its token, a home of its own (no access to the owner's)."""
    return unstall.Sidecar(owner.flight_location, token=token, home=tmp_path / "tenant-home", start=False)


def _bearer(token: str) -> fl.FlightCallOptions:
    return fl.FlightCallOptions(headers=[(b"authorization", b"Bearer " + token.encode())])


def test_a_tenant_token_reads_only_its_granted_datasets(owner: unstall.Sidecar, tmp_path: Path) -> None:
    issued = owner.issue_token(["granted-ds", "granted-later"], name="bob")
    assert issued.token not in repr(issued)
    with _tenant(owner, issued.token, tmp_path) as tenant:
        assert not tenant.has_control_plane and tenant.local_client() is None
        assert [d.name for d in tenant.list_datasets()] == ["granted-ds"]
        assert set(tenant.stats().datasets) <= {"granted-ds"}
        with pytest.raises(unstall.PermissionDeniedError, match="not granted dataset 'secret-ds'") as err:
            tenant.describe("secret-ds")
        assert issued.id in str(err.value) and "granted-ds" not in str(err.value) and issued.token not in str(err.value)
        with pytest.raises(unstall.DatasetNotFoundError) as missing:  # granted, not registered (yet)
            tenant.describe("granted-later")
        assert "secret-ds" not in str(missing.value), "an unknown-dataset error lists only what the tenant may see"

        ds = Dataset("granted-ds", sidecar=tenant)
        assert ds.transport == "flight"
        batches = list(DataLoader(ds, batch_size=4, num_workers=0, collate_fn=keep))
        assert sum(len(b) for b in batches) == 6

        with tenant.flight_client() as c:
            with pytest.raises(unstall.PermissionDeniedError, match="secret-ds"):
                c.fetch("secret-ds", [0])
            with pytest.raises(unstall.PermissionDeniedError, match="secret-ds"):
                c.prefetch("secret-ds", [0, 1], epoch=0)
            with pytest.raises(unstall.PermissionDeniedError, match="secret-ds"):
                c.do_action("prep.join", json.dumps({"dataset": "secret-ds", "pipeline": None, "batch_size": 2}).encode())
        with fl.connect(owner.flight_location) as raw:
            with pytest.raises(fl.FlightUnauthorizedError, match="secret-ds"):
                raw.do_get(fl.Ticket(encode_fetch_ticket("secret-ds", [0])), _bearer(issued.token)).read_all()
            with pytest.raises(fl.FlightUnauthorizedError, match="secret-ds"):
                raw.get_flight_info(fl.FlightDescriptor.for_path("secret-ds"), _bearer(issued.token))
            names = [i.descriptor.path[0].decode() for i in raw.list_flights(b"", _bearer(issued.token))]
            assert names == ["granted-ds"]
    # the owner still reads everything
    assert {d.name for d in owner.list_datasets()} >= {"granted-ds", "secret-ds"}
    owner.revoke_token(issued.id)


def test_a_tenant_cannot_register_export_or_reach_the_control_plane(owner: unstall.Sidecar, tmp_path: Path) -> None:
    issued = owner.issue_token(["granted-ds"])
    with pytest.raises(unstall.AuthenticationError, match="rejected the token") as err:
        unstall.Sidecar(owner.flight_location, token=issued.token, control_port=owner.control_port,
                        home=tmp_path / "h", start=False)
    assert issued.token not in str(err.value)
    gateway = JavaGateway(gateway_parameters=GatewayParameters(
        port=owner.control_port, auth_token=issued.token, eager_load=False, read_timeout=10))
    try:
        with pytest.raises(Py4JError):
            gateway.entry_point.registerDataset("mine", "imagefolder", str(tmp_path), "{}")
        with pytest.raises(Py4JError):
            gateway.entry_point.exportManifest("secret-ds", str(tmp_path / "m"))
    finally:
        gateway.close()
    with _tenant(owner, issued.token, tmp_path) as tenant:
        with pytest.raises(unstall.SidecarUnavailableError, match="control port"):
            tenant.register_dataset("mine", tmp_path)
        with pytest.raises(unstall.SidecarUnavailableError, match="control port"):
            tenant.issue_token(["secret-ds"])
    with fl.connect(owner.flight_location) as raw:
        with pytest.raises(pa.ArrowNotImplementedError, match="unknown action 'registerDataset'"):
            list(raw.do_action(fl.Action("registerDataset", b"{}"), _bearer(issued.token)))
    # the same-host socket is the owner's: a tenant token is refused at HELLO
    assert owner.local_endpoint
    with LocalClient(owner.local_endpoint, issued.token) as local:
        with pytest.raises(unstall.AuthenticationError):
            local.connect()
    assert {d.name for d in owner.list_datasets()} == {"granted-ds", "secret-ds"}, "the tenant registered nothing"
    owner.revoke_token(issued.id)


def test_revocation_takes_effect_on_the_next_call(owner: unstall.Sidecar, tmp_path: Path) -> None:
    issued = owner.issue_token(["granted-ds"], name="carol")
    tenants_file = owner.home / "tenants.json"
    assert stat.S_IMODE(tenants_file.stat().st_mode) == 0o600
    assert issued.token not in tenants_file.read_text(), "stored hashed, never in plaintext"
    assert issued.id in {t.id for t in owner.list_tokens()}
    with FlightClient(owner.flight_location, issued.token) as c:
        assert c.fetch("granted-ds", [0, 1]).num_rows == 2
        owner.revoke_token(issued.id)
        with pytest.raises(unstall.AuthenticationError, match="not revoked") as err:
            c.fetch("granted-ds", [0, 1])
        assert issued.token not in str(err.value)
    assert issued.id not in {t.id for t in owner.list_tokens()}
    with pytest.raises(unstall.InvalidRequestError, match=f"no tenant token has id '{issued.id}'"):
        owner.revoke_token(issued.id)
    log = (owner.home / "sidecar.log").read_text()
    assert issued.token not in log and owner.token not in log, "no token is ever logged"


def test_the_control_plane_refuses_reflection(owner: unstall.Sidecar) -> None:
    gateway = JavaGateway(gateway_parameters=GatewayParameters(
        port=owner.control_port, auth_token=owner.token, eager_load=False, read_timeout=10))
    try:
        ep = gateway.entry_point
        assert ep.protocolVersion() == 1
        with pytest.raises(Py4JError, match="refused reflection"):
            gateway.jvm.java.lang.Runtime.getRuntime()
        with pytest.raises(Py4JError, match="refused reflection"):
            gateway.jvm.java.lang.System.getProperty("user.name")
        with pytest.raises(Py4JError, match="'notAMethod': not a control-plane method"):
            ep.notAMethod()
        with pytest.raises(Py4JError, match="'getClass': not a control-plane method"):
            ep.getClass().forName("java.lang.Runtime")
        with pytest.raises(Py4JError, match="refused"):
            gateway.java_gateway_server.getGateway()
        with pytest.raises(Py4JError, match="refused"):
            gateway.new_array(gateway.jvm.java.lang.String, 2)
        with pytest.raises(Py4JError, match="refused"):
            gateway.help(ep, display=False)
        assert ep.protocolVersion() == 1, "the connection goes on after refusals"
    finally:
        gateway.close()
    # the shim's own calls work, errors still name the thing
    with pytest.raises(unstall.DatasetNotFoundError, match="nope-ds"):
        owner.describe("nope-ds")
    assert owner.protocol_version() == 1
    assert "refused reflection" in (owner.home / "sidecar.log").read_text()


def test_registration_and_manifests_are_checked_against_the_sidecar_user_and_allowed_roots(
        start_sidecar, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    data = shared / "data"
    make_image_folder(data, ["a"], per_class=2, seed=5, extras=False)
    strict = start_sidecar("1MiB")
    # manifests: under the sidecar home (or an allowed root) only
    strict.register_dataset("own", data)
    with pytest.raises(unstall.PermissionDeniedError, match=f"{tmp_path / 'out.manifest'} is outside the sidecar home"):
        strict.export_manifest("own", tmp_path / "out.manifest")
    assert not (tmp_path / "out.manifest").exists()
    exported = strict.export_manifest("own", strict.home / "own.manifest")
    assert exported.num_samples == 2 and (strict.home / "own.manifest").exists()
    shutil.copy(strict.home / "own.manifest", tmp_path / "copy.manifest")
    with pytest.raises(unstall.PermissionDeniedError, match="outside the sidecar home"):
        strict.register_dataset("again", data, options={"manifest": str(tmp_path / "copy.manifest")})
    strict.register_dataset("again", data, options={"manifest": str(strict.home / "own.manifest")})

    if os.geteuid() != 0:
        pytest.skip("the rest makes a directory another user's, which needs root")
    for p in [shared, *shared.rglob("*")]:
        os.chown(p, NOBODY, NOBODY)
    with pytest.raises(unstall.PermissionDeniedError, match=f"{data} belongs to user .*--allow-root \\(none given\\)"):
        strict.register_dataset("theirs", data)
    allowing = start_sidecar("1MiB", extra_args=("--allow-root", str(shared)))
    assert allowing.register_dataset("theirs", data).num_samples == 2
    allowing.export_manifest("theirs", shared / "theirs.manifest")
    assert stat.S_IMODE((shared / "theirs.manifest").stat().st_mode) == 0o600


def test_tokens_from_the_python_and_java_clis(owner: unstall.Sidecar, sidecar_jar: Path, tmp_path: Path) -> None:
    env = dict(os.environ, UNSTALL_HOME=str(owner.home))
    out = subprocess.run([sys.executable, "-m", "unstall", "token", "issue", "--dataset", "granted-ds", "--name", "dan"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip()
    assert len(token) == 64 and token not in out.stderr
    listed = subprocess.run([sys.executable, "-m", "unstall", "token", "list"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0 and "dan" in listed.stdout and token not in listed.stdout, listed.stderr
    token_id = next(t.id for t in owner.list_tokens() if t.name == "dan")
    with FlightClient(owner.flight_location, token) as c:
        assert c.fetch("granted-ds", [2]).num_rows == 1
    revoked = subprocess.run([sys.executable, "-m", "unstall", "token", "revoke", token_id], env=env,
                             capture_output=True, text=True, timeout=60)
    assert revoked.returncode == 0, revoked.stderr
    with FlightClient(owner.flight_location, token) as c:
        with pytest.raises(unstall.AuthenticationError):
            c.fetch("granted-ds", [2])
    # the Java CLI writes tenants.json itself: the running sidecar sees it at the next call
    java = shutil.which("java") or "java"
    issued = subprocess.run([java, "-jar", str(sidecar_jar), "token", "issue", "--home", str(owner.home),
                             "--dataset", "granted-ds"], capture_output=True, text=True, timeout=60)
    assert issued.returncode == 0, issued.stderr
    with FlightClient(owner.flight_location, issued.stdout.strip()) as c:
        assert c.fetch("granted-ds", [3]).num_rows == 1
    nothing = subprocess.run([sys.executable, "-m", "unstall", "token", "list"],
                             env=dict(env, UNSTALL_HOME=str(tmp_path / "none")), capture_output=True, text=True,
                             timeout=60)
    assert nothing.returncode == 2 and "no sidecar is running" in nothing.stderr


_PEER = """
import socket, struct, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect:", e.strerror); sys.exit(0)
n = struct.unpack("<I", s.recv(4))[0]
body = b""
while len(body) < n:
    body += s.recv(n - len(body))
print("reply:", body[1], body[2:].decode())
"""


def test_the_local_socket_is_the_owners_uid_only(start_sidecar) -> None:
    if os.geteuid() != 0 or not Path("/usr/bin/python3").exists():
        pytest.skip("connecting as another user needs root (and a system python3 that user may run)")
    s = start_sidecar("1MiB")
    sock = Path(s.local_endpoint)
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700 and stat.S_IMODE(sock.stat().st_mode) == 0o600

    def as_nobody() -> str:
        out = subprocess.run(["/usr/bin/python3", "-c", _PEER, str(sock)], user=NOBODY, group=NOBODY, extra_groups=[],
                             capture_output=True, text=True, timeout=30, cwd="/")
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert as_nobody().startswith("connect: Permission denied"), "the 0700 directory keeps other users out"
    # even with the directory opened up, the sidecar checks the peer's uid (SO_PEERCRED)
    os.chmod(sock.parent, 0o711)
    os.chmod(sock, 0o666)
    try:
        reply = as_nobody()
    finally:
        os.chmod(sock, 0o600)
        os.chmod(sock.parent, 0o700)
    assert reply.startswith("reply: 5 ") and "for its own user" in reply, reply
    wait_until(lambda: "refused a connection from user" in (s.home / "sidecar.log").read_text(), "the refusal logged")
    assert s.local_client() is not None and s.protocol_version() == 1
