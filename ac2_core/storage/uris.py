"""Artifact URIs resolved to a file system: local paths, ``file://`` and ``s3://`` (through s3fs).

An ``s3://`` URI gets its endpoint and region from the active ``storage`` settings or the
environment, and its credentials from the environment only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import fsspec

from ac2_core.config import StorageConfig
from ac2_core.storage.active import settings
from ac2_core.storage.manifest import ArtifactError

S3_PROTOCOLS = ("s3", "s3a")
CREDENTIAL_VARS = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"


@dataclass(frozen=True)
class Target:
    """One artifact URI, resolved: its file system, the path on it, and the settings used."""

    uri: str
    fs: fsspec.AbstractFileSystem
    path: str
    section: StorageConfig
    endpoint: str | None = None  # named in error messages of remote file systems

    @property
    def local(self) -> bool:
        return is_local(self.fs)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def _protocol(uri: str) -> str:
    protocol, _ = fsspec.core.split_protocol(uri)
    return protocol or "file"


def _s3_fs(uri: str, section: StorageConfig) -> tuple[fsspec.AbstractFileSystem, str | None]:
    """An s3fs file system for ``uri``: endpoint and region from the config or the environment,
    credentials from the environment only."""
    env = os.environ
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    web_identity = env.get("AWS_WEB_IDENTITY_TOKEN_FILE") and env.get("AWS_ROLE_ARN")
    if bool(key) != bool(secret):
        missing = "AWS_SECRET_ACCESS_KEY" if key else "AWS_ACCESS_KEY_ID"
        raise ArtifactError(f"{uri}: incomplete S3 credentials: {missing} is not set (set both {CREDENTIAL_VARS})")
    if not key and not web_identity:
        raise ArtifactError(
            f"{uri}: no S3 credentials: set {CREDENTIAL_VARS} in the environment (for example from a"
            " Kubernetes secret), or AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE; ac2 never takes"
            " credentials from its config"
        )
    try:
        import s3fs
    except ImportError:
        raise ArtifactError(f"{uri}: s3:// needs s3fs: pip install 'ac2[s3]'") from None
    endpoint = section.endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    region = section.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    options: dict = dict(
        endpoint_url=endpoint,
        client_kwargs={"region_name": region} if region else {},
        config_kwargs={
            "connect_timeout": section.connect_timeout,
            "read_timeout": section.read_timeout,
            # one try per request in botocore and in s3fs: remote.call's loop is the only retry loop
            "retries": {"total_max_attempts": 1, "mode": "standard"},
        },
        use_listings_cache=False,  # another process may have written since the last listing
    )
    if key:  # otherwise botocore reads the web identity from the same environment
        options.update(key=key, secret=secret, token=env.get("AWS_SESSION_TOKEN") or None)
    fs = s3fs.S3FileSystem(**options)
    fs.retries = 1  # a class attribute in s3fs (5 tries); one here, as for botocore above
    return fs, endpoint or "AWS S3"


def target(uri: str, *, write: bool = False) -> Target:
    """Resolve ``uri``; a write outside ``storage.artifact_root`` is refused here, before anything exists."""
    section = settings()
    if write:
        _check_root(uri, section)
    if _protocol(uri) in S3_PROTOCOLS:
        fs, endpoint = _s3_fs(uri, section)
        return Target(uri, fs, fs._strip_protocol(uri), section, endpoint)
    try:
        fs, path = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as e:
        raise ArtifactError(f"{uri}: unsupported URI ({e})") from None
    return Target(uri, fs, path, section, None if is_local(fs) else _protocol(uri))


def _normalized(uri: str) -> tuple[str, str]:
    """(protocol, path) in one spelling, so that a prefix test is a containment test."""
    protocol = _protocol(uri)
    _, path = fsspec.core.split_protocol(uri)
    if protocol in ("file", "local"):
        return "file", os.path.abspath(path)  # abspath also folds "." and ".."
    parts = [p for p in path.split("/") if p]
    if "." in parts or ".." in parts:
        raise ArtifactError(f"{uri}: '.' and '..' are not allowed in an object-store URI")
    return ("s3" if protocol in S3_PROTOCOLS else protocol), "/".join(parts)


def _check_root(uri: str, section: StorageConfig) -> None:
    if section.artifact_root is None:
        return
    root, found = _normalized(section.artifact_root), _normalized(uri)
    if root[0] != found[0] or not found[1].startswith(root[1].rstrip("/") + "/"):
        raise ArtifactError(
            f"{uri}: not under the artifact root {section.artifact_root} (storage.artifact_root); nothing was written"
        )


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])
