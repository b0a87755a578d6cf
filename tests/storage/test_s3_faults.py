"""Object storage that fails: a server killed mid-upload, a short outage, a stalled endpoint.

These tests kill and restart their own SeaweedFS (same data folder), not the session's.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import torch
from safetensors.torch import save_file

from ac2_core import storage
from ac2_core.config import StorageConfig
from ac2_core.storage import ArtifactError
from tests.storage.conftest import s3_for, start_seaweed
from tests.storage.test_local_artifacts import CFG_HASH, _pairs, _write_pairs

SHARD_VALUES = 4 << 20  # float32 values of one shard: 16 MiB


@pytest.fixture(scope="module")
def own_server(tmp_path_factory):
    server = start_seaweed(tmp_path_factory.mktemp("seaweed-faults"))
    yield server
    server.stop(grace=2)


def _publish_checkpoint(uri: str, n_shards: int) -> list[str]:
    """A model folder of ``n_shards`` 16 MiB safetensors shards and an optimizer file (fixed seed)."""
    gen = torch.Generator().manual_seed(0)
    with storage.publish_dir(uri, kind="actor", stage="update_actor", config_hash=CFG_HASH) as staging:
        for i in range(n_shards):
            save_file({"w": torch.randn(SHARD_VALUES, generator=gen)}, str(staging / f"model-{i:05d}.safetensors"))
        save_file({"w::exp_avg": torch.randn(1024, generator=gen)}, str(staging / "optimizer.safetensors"))
        return sorted(p.name for p in staging.iterdir())


class _KillOnFirstObject(threading.Thread):
    """Kill the server as soon as one object has arrived under ``prefix``."""

    def __init__(self, server, prefix: str):
        super().__init__(daemon=True)
        self.server, self.prefix, self.killed_at, self.error = server, prefix, None, None

    def run(self):
        fs = self.server.client()
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline:
                if fs.find(self.prefix):
                    self.server.kill()
                    self.killed_at = time.monotonic()
                    return
                time.sleep(0.01)
        except Exception as e:  # noqa: BLE001  (reported by the test)
            self.error = e


def test_server_killed_mid_upload_leaves_no_readable_artifact_and_a_rerun_succeeds(own_server, clean_aws_env, tmp_path):
    with s3_for(own_server, clean_aws_env, "killed", io_threads=1) as s3:  # one file at a time: a kill lands mid-way
        earlier, uri = s3.uri("earlier"), s3.uri("actor")
        _write_pairs(earlier)
        killer = _KillOnFirstObject(own_server, uri.removeprefix("s3://") + "/")
        killer.start()
        with pytest.raises(ArtifactError) as err:
            _publish_checkpoint(uri, n_shards=5)
        killer.join(timeout=60)
        assert killer.error is None and killer.killed_at is not None
        message = str(err.value)
        assert message.startswith(f"{uri}: upload of ") and "failed after" in message
        assert own_server.endpoint in message

        own_server.start()  # same data folder
        assert not storage.exists(uri)
        with pytest.raises(ArtifactError, match="never published whole"):
            storage.local_model_dir(uri, kind="actor", cache_dir=str(tmp_path))
        assert storage.read_rows(earlier, kind="critic_pairs") == _pairs()

        names = _publish_checkpoint(uri, n_shards=5)  # the rerun
        assert s3.objects(uri) == sorted([*names, "manifest.json"])
        folder = storage.local_model_dir(uri, kind="actor", cache_dir=str(tmp_path))
        assert sorted(p.name for p in folder.iterdir()) == sorted([*names, "manifest.json"])


def test_an_outage_shorter_than_the_retry_budget_is_ridden_out(own_server, clean_aws_env):
    with s3_for(own_server, clean_aws_env, "outage", max_attempts=10, max_retry_seconds=30, backoff_seconds=0.25) as s3:
        uri = s3.uri("critic_pairs")
        own_server.kill()
        restart = threading.Timer(1.0, own_server.start)
        restart.start()
        try:
            _write_pairs(uri)  # meets the dead server, retries, and lands on the restarted one
        finally:
            restart.join()
        assert storage.read_rows(uri, kind="critic_pairs") == _pairs()


def _stalled_endpoint() -> socket.socket:
    """A TCP port that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


@pytest.mark.parametrize(
    "settings, bound",
    [
        (dict(connect_timeout=1.0, read_timeout=1.0, max_attempts=5, max_retry_seconds=2.0, backoff_seconds=0.2), 6.0),
        ({}, 30.0),  # the defaults: a stalled endpoint is reported within half a minute
    ],
    ids=["short", "defaults"],
)
def test_a_stalled_endpoint_is_retried_then_reported_in_bounded_time(clean_aws_env, settings, bound):
    clean_aws_env.setenv("AWS_ACCESS_KEY_ID", "test")
    clean_aws_env.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with _stalled_endpoint() as sock:
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
        section = StorageConfig(endpoint_url=endpoint, **settings)
        uri = "s3://bucket/run/critic_pairs"
        with storage.using(section):
            t0 = time.monotonic()
            with pytest.raises(ArtifactError) as err:
                _write_pairs(uri)
            elapsed = time.monotonic() - t0
    message = str(err.value)
    # no retry starts after max_retry_seconds; the try under way ends at its timeouts
    assert elapsed < min(bound, section.max_retry_seconds + section.connect_timeout + 3 * section.read_timeout)
    assert elapsed >= section.read_timeout  # it did wait for an answer
    assert message.startswith(f"{uri}: ") and "failed after" in message and endpoint in message
    assert "storage.max_retry_seconds" in message
    assert "ReadTimeout" in message or "TimeoutError" in message
