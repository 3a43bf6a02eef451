"""A real S3-API server for tests and benchmarks: S3Proxy (transient blob store) in its own JVM, from the tests
module's classpath (``mvn -pl tests -am package``; ``scripts/setup.sh --build`` builds it). A module of its own
(never ``from conftest import``), used by test_s3.py, benchmarks/bench_tiers.py and benchmarks/bench_cluster.py."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Optional

__all__ = ["S3Proxy", "S3ProxyMissing", "ACCESS_KEY", "SECRET_KEY"]

REPO = Path(__file__).resolve().parents[2]
READY = "S3PROXY READY "
ACCESS_KEY = "unstall-test"
SECRET_KEY = "unstall-test-secret"
START_TIMEOUT = 60.0  # a bound on a hang, not a timing assertion


class S3ProxyMissing(RuntimeError):
    """The S3ProxyServer classes are not built."""


class S3Proxy:
    """S3Proxy serving on ``host`` (a free port), as a context manager; ``endpoint`` is its URL once entered.

    ``host`` is the address it binds and announces (``127.0.0.1``; a bridge address to serve network namespaces).
    """

    def __init__(self, log: Path, host: str = "127.0.0.1", java: str = "java",
                 access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> None:
        classpath_file = REPO / "tests" / "target" / "s3proxy.classpath"
        classes = REPO / "tests" / "target" / "classes"
        if not classpath_file.is_file() or not (classes / "io" / "unstall" / "tests" / "S3ProxyServer.class").is_file():
            raise S3ProxyMissing(f"S3ProxyServer not built ({classpath_file}): mvn -pl tests -am package")
        self.argv = [java, "-cp", f"{classes}:{classpath_file.read_text().strip()}", "io.unstall.tests.S3ProxyServer",
                     "--host", host, "--port", "0", "--identity", access_key, "--credential", secret_key]
        self.log = log
        self.access_key = access_key
        self.secret_key = secret_key
        self.endpoint = ""
        self._proc: Optional[subprocess.Popen[bytes]] = None

    def __enter__(self) -> S3Proxy:
        with open(self.log, "wb") as out:
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.endpoint:
            text = self.log.read_text(errors="replace")
            for line in text.splitlines():
                if line.startswith(READY):
                    self.endpoint = line[len(READY):].strip()
            if not self.endpoint:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"S3ProxyServer did not start (exit {self._proc.poll()}); log:\n{text}")
                time.sleep(0.05)
        return self

    def client(self, **config: Any) -> Any:
        """A boto3 client for it, the way users upload datasets (path-style addressing, checksums when required)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, request_checksum_calculation="when_required",
                          response_checksum_validation="when_required", **config),
        )

    def environment(self) -> dict[str, str]:
        """The AWS environment variables that point a sidecar (or boto3) at it."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": "us-east-1"}

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def __exit__(self, t: Optional[type[BaseException]], e: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.close()
