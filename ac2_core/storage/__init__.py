"""Artifacts at fsspec URIs: tables and model directories, published whole or not at all.

Every artifact is a directory:

    <uri>/data.parquet      (tables)   or the files of an HF model directory
    <uri>/manifest.json     written last: kind, schema version, rows, sha256 of every file

Writers stage everything in a temporary local folder and publish it in one step, so a
crash leaves nothing at ``<uri>`` that a reader would take. Readers verify the manifest
(kind, schema version, row count, every file's hash) before trusting the data. The
manifest holds no timestamp, so a rerun on the same inputs gives identical bytes.

Object storage (``s3://``, through s3fs) is reached with the ``storage`` config section,
which a runner makes active for a block of work: ``with storage.using(cfg.storage): ...``.
Outside such a block the defaults apply (endpoint and region from the environment).
Credentials come only from the standard AWS environment variables, never from the config.
Every remote request is retried on transient errors, bounded in tries and in time
(``storage.max_attempts``, ``storage.max_retry_seconds``); s3fs's and botocore's own
retries are turned off so that these are the only bounds, and their connect and read
timeouts are set, so a stalled endpoint is reported instead of waited on.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.asyn import AsyncFileSystem

from ac2_core.config import StorageConfig
from ac2_core.schemas import SCHEMA_VERSION, schema_for

MANIFEST = "manifest.json"
DATA = "data.parquet"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
S3_PROTOCOLS = ("s3", "s3a")
CREDENTIAL_VARS = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"

log = logging.getLogger(__name__)
T = TypeVar("T")


class ArtifactError(RuntimeError):
    """An artifact that cannot be read or written; the message names the URI."""


@dataclass(frozen=True)
class Manifest:
    kind: str
    stage: str
    config_hash: str
    schema_version: int
    rows: int | None
    files: dict[str, dict]  # name -> {"sha256": ..., "bytes": ...}

    @property
    def content_hash(self) -> str:
        """One hash for the whole artifact: over its files' names and hashes."""
        h = hashlib.sha256()
        for name in sorted(self.files):
            h.update(f"{name}\0{self.files[name]['sha256']}\n".encode())
        return h.hexdigest()

    def to_json(self) -> str:
        body = {
            "format": "ac2-artifact",
            "kind": self.kind,
            "stage": self.stage,
            "config_hash": self.config_hash,
            "schema_version": self.schema_version,
            "rows": self.rows,
            "files": {k: self.files[k] for k in sorted(self.files)},
            "content_hash": self.content_hash,
        }
        return json.dumps(body, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, uri: str) -> Manifest:
        try:
            body = json.loads(text)
            if body.get("format") != "ac2-artifact":
                raise ValueError("format is not ac2-artifact")
            return cls(
                kind=body["kind"],
                stage=body["stage"],
                config_hash=body["config_hash"],
                schema_version=int(body["schema_version"]),
                rows=body["rows"],
                files=dict(body["files"]),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ArtifactError(f"{uri}: {MANIFEST} is malformed ({e})") from None


# ---------------------------------------------------------------------- settings

_active: contextvars.ContextVar[StorageConfig | None] = contextvars.ContextVar("ac2_storage", default=None)


@contextlib.contextmanager
def using(section: StorageConfig) -> Iterator[StorageConfig]:
    """Make ``section`` (``cfg.storage``) the storage settings of this block.

    Runners wrap their work in it; a stage called on its own uses the defaults unless
    its caller does the same. The setting is scoped to the block (a context variable),
    so nothing leaks from one run into the next.
    """
    token = _active.set(section)
    try:
        yield section
    finally:
        _active.reset(token)


def settings() -> StorageConfig:
    """The storage settings in effect here: the innermost ``using`` block, or the defaults."""
    return _active.get() or StorageConfig()


# --------------------------------------------------------------------------- URIs


@dataclass(frozen=True)
class _Target:
    """One artifact URI, resolved: its file system, the path on it, and the settings used."""

    uri: str
    fs: fsspec.AbstractFileSystem
    path: str
    section: StorageConfig
    endpoint: str | None = None  # named in error messages of remote file systems

    @property
    def local(self) -> bool:
        return _is_local(self.fs)


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
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
            # one try per request in botocore and in s3fs: _call's loop is the only retry loop
            "retries": {"total_max_attempts": 1, "mode": "standard"},
        },
        use_listings_cache=False,  # another process may have written since the last listing
    )
    if key:  # otherwise botocore reads the web identity from the same environment
        options.update(key=key, secret=secret, token=env.get("AWS_SESSION_TOKEN") or None)
    fs = s3fs.S3FileSystem(**options)
    fs.retries = 1  # a class attribute in s3fs (5 tries); one here, as for botocore above
    return fs, endpoint or "AWS S3"


def _target(uri: str, *, write: bool = False) -> _Target:
    """Resolve ``uri``; a write outside ``storage.artifact_root`` is refused here, before anything exists."""
    section = settings()
    if write:
        _check_root(uri, section)
    if _protocol(uri) in S3_PROTOCOLS:
        fs, endpoint = _s3_fs(uri, section)
        return _Target(uri, fs, fs._strip_protocol(uri), section, endpoint)
    try:
        fs, path = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as e:
        raise ArtifactError(f"{uri}: unsupported URI ({e})") from None
    return _Target(uri, fs, path, section, None if _is_local(fs) else _protocol(uri))


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
    root, target = _normalized(section.artifact_root), _normalized(uri)
    if root[0] != target[0] or not target[1].startswith(root[1].rstrip("/") + "/"):
        raise ArtifactError(
            f"{uri}: not under the artifact root {section.artifact_root} (storage.artifact_root); nothing was written"
        )


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])


# ---------------------------------------------------------------------- retries


# Errors that another try would meet again: a missing object, refused credentials, a bad request.
_PERMANENT = (ArtifactError, FileNotFoundError, PermissionError, FileExistsError, IsADirectoryError, NotADirectoryError)
_PERMANENT_ERRNOS = (errno.EINVAL, errno.EPERM, errno.EACCES, errno.EMSGSIZE, errno.ENOTEMPTY)


def _transient(err: BaseException) -> bool:
    """True for errors that another try may not meet: timeouts, dropped connections, 5xx."""
    if isinstance(err, (*_PERMANENT, ValueError, TypeError, KeyError)):
        return False
    if isinstance(err, (TimeoutError, ConnectionError)):  # asyncio's and fsspec's timeouts included
        return True
    with contextlib.suppress(ImportError):
        import botocore.exceptions as bx

        if isinstance(err, (bx.NoCredentialsError, bx.PartialCredentialsError, bx.ParamValidationError)):
            return False
        if isinstance(err, (bx.ConnectionError, bx.HTTPClientError, bx.IncompleteReadError, bx.ResponseStreamingError)):
            return True
        if isinstance(err, bx.ClientError):
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            return status >= 500 or err.response.get("Error", {}).get("Code") in ("SlowDown", "Throttling", "RequestTimeout")
    with contextlib.suppress(ImportError):
        import aiohttp

        if isinstance(err, aiohttp.ClientError):
            return True
    if isinstance(err, OSError):  # s3fs's translation of S3 error codes
        return err.errno not in _PERMANENT_ERRNOS
    return False


def _why(err: BaseException) -> str:
    text = str(err).strip() or repr(err)
    return f"{type(err).__name__}: {text}"


# An attempt that moves less than this counts as stalled: aiohttp has no write timeout,
# so a peer that stops reading would otherwise hold a PUT forever.
_STALL_BYTES_PER_SECOND = 1 << 20


def _call(t: _Target, what: str, method: str, *args, nbytes: int = 0, missing_ok: bool = False, **kwargs):
    """``t.fs.<method>(*args)`` with bounded retries; any failure becomes an ArtifactError
    naming the URI, except FileNotFoundError where the caller handles it (``missing_ok``).

    Local paths are called once: retrying a local file system only delays its error.
    """
    fn = getattr(t.fs, method)
    if t.local:
        return fn(*args, **kwargs)
    s = t.section
    if isinstance(t.fs, AsyncFileSystem):  # a hard bound per attempt, on top of the socket timeouts
        kwargs["timeout"] = s.connect_timeout + 3 * s.read_timeout + nbytes / _STALL_BYTES_PER_SECOND
    start = time.monotonic()
    for attempt in range(1, s.max_attempts + 1):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001  (sorted below)
            if isinstance(err, FileNotFoundError) and missing_ok:
                raise
            if not _transient(err):
                verb = "was refused by" if isinstance(err, PermissionError) else "failed at"
                raise ArtifactError(f"{t.uri}: {what} {verb} {t.endpoint}: {_why(err)}") from err
            elapsed = time.monotonic() - start
            pause = s.backoff_seconds * 2 ** (attempt - 1)
            if attempt == s.max_attempts or elapsed + pause > s.max_retry_seconds:
                raise ArtifactError(
                    f"{t.uri}: {what} failed after {attempt} attempt(s) in {elapsed:.1f}s at {t.endpoint}"
                    f" (storage.max_attempts={s.max_attempts}, storage.max_retry_seconds={s.max_retry_seconds:g});"
                    f" last error: {_why(err)}"
                ) from err
            log.warning("%s: %s failed (%s); retry %d of %d in %.1fs", t.uri, what, _why(err), attempt, s.max_attempts - 1, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")


def _in_parallel(jobs: list[Callable[[], T]], threads: int) -> list[T]:
    """Run ``jobs`` on a thread pool; the first error cancels what has not started and is raised."""
    if len(jobs) <= 1 or threads <= 1:
        return [job() for job in jobs]
    with ThreadPoolExecutor(max_workers=min(threads, len(jobs)), thread_name_prefix="ac2-storage") as pool:
        futures = [pool.submit(job) for job in jobs]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for f in pending:
            f.cancel()
        failed = [f for f in futures if f.done() and not f.cancelled() and f.exception() is not None]
        if failed:
            wait([f for f in pending if not f.cancelled()])  # let started transfers end before raising
            raise failed[0].exception()
        return [f.result() for f in futures]


def _objects(t: _Target) -> list[str]:
    """Names of the objects under a remote artifact, relative to it."""
    found = _call(t, "listing", "find", t.path, detail=True)
    prefix = t.path.rstrip("/") + "/"
    return sorted(p[len(prefix) :] for p, info in found.items() if info.get("type") == "file" and p.startswith(prefix))


def exists(uri: str) -> bool:
    """True when a *published* artifact (one with a manifest) is at ``uri``."""
    t = _target(uri)
    if t.local:
        return t.fs.exists(join(t.path, MANIFEST))
    try:
        _call(t, f"lookup of {MANIFEST}", "info", join(t.path, MANIFEST), missing_ok=True)
        return True
    except FileNotFoundError:
        return False


def find_artifacts(root: str) -> list[str]:
    """URIs of every published artifact (a folder with a manifest) under ``root``, sorted."""
    t = _target(root)
    manifests = _call(t, "listing", "glob", f"{t.path.rstrip('/')}/**/{MANIFEST}")
    folders = sorted(m[: -len(MANIFEST) - 1] for m in manifests)
    return folders if t.local else [t.fs.unstrip_protocol(f) for f in folders]


def remove(uri: str) -> None:
    """Delete the artifact at ``uri``, manifest first, so that no reader trusts what is left meanwhile."""
    t = _target(uri, write=True)
    if t.local:
        with contextlib.suppress(FileNotFoundError):
            Path(t.path, MANIFEST).unlink()
        shutil.rmtree(t.path, ignore_errors=True)
        return
    _remove_remote(t)


def _remove_remote(t: _Target) -> None:
    with contextlib.suppress(FileNotFoundError):
        _call(t, f"removal of the old {MANIFEST}", "rm_file", join(t.path, MANIFEST), missing_ok=True)
    stale = [join(t.path, name) for name in _objects(t)]
    if stale:
        _call(t, f"removal of {len(stale)} old file(s)", "rm", stale)


# ------------------------------------------------------------------- publishing


def _sha256_file(path: Path) -> dict:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"sha256": h.hexdigest(), "bytes": path.stat().st_size}


def _describe(staging: Path, threads: int) -> dict[str, dict]:
    names = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
    # hashlib releases the GIL on large buffers, so shards hash in parallel
    hashes = _in_parallel([lambda n=n: _sha256_file(staging / n) for n in names], threads)
    return dict(zip(names, hashes))


def _publish_local(staging: Path, target: Path) -> None:
    # staging is a sibling of target, so both renames stay on one file system.
    old = None
    if target.exists() or target.is_symlink():
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        target.rename(old)
    staging.rename(target)  # the one step that makes the artifact visible
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _publish_remote(t: _Target, staging: Path, files: dict[str, dict], manifest_text: str) -> None:
    # Object stores have no atomic directory rename: the manifest, written last, is the
    # commit point. The old manifest goes first, so no reader trusts a half-replaced set,
    # then every old object, so that a rerun leaves no file of the previous version behind.
    _remove_remote(t)
    uploads = [
        lambda n=n: _call(t, f"upload of {n}", "put_file", str(staging / n), join(t.path, n), nbytes=files[n]["bytes"])
        for n in sorted(files)
    ]
    _in_parallel(uploads, t.section.io_threads)
    _call(t, f"upload of {MANIFEST}", "pipe_file", join(t.path, MANIFEST), manifest_text.encode())


@contextlib.contextmanager
def publish_dir(uri: str, *, kind: str, stage: str, config_hash: str, rows: int | None = None) -> Iterator[Path]:
    """Yield an empty local folder; when the block ends without error, publish it at ``uri``.

    On an exception nothing is published and whatever was at ``uri`` before stays.
    """
    t = _target(uri, write=True)  # refuses a URI outside the artifact root, or without credentials
    parent = Path(t.path).parent if t.local else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{Path(t.path).name}.staging-", dir=parent))
    try:
        yield staging
        if (staging / MANIFEST).exists():
            raise ArtifactError(f"{uri}: the writer must not create {MANIFEST} itself")
        files = _describe(staging, t.section.io_threads)
        manifest = Manifest(kind, stage, config_hash, SCHEMA_VERSION, rows, files)
        if parent is not None:
            (staging / MANIFEST).write_text(manifest.to_json())
            _publish_local(staging, Path(t.path))
        else:
            _publish_remote(t, staging, files, manifest.to_json())
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# ----------------------------------------------------------------------- tables


def _has_nan(col: pa.ChunkedArray, typ: pa.DataType) -> bool:
    if pa.types.is_list(typ):
        if not pa.types.is_floating(typ.value_type):
            return False
        col = pa.chunked_array([c.flatten() for c in col.chunks], type=typ.value_type)
    elif not pa.types.is_floating(typ):
        return False
    return bool(pc.any(pc.is_nan(col)).as_py() or False)


def _check_schema(table: pa.Table, kind: str, where: str) -> pa.Table:
    """Return ``table`` in the declared column order; raise naming the first mismatch."""
    declared = schema_for(kind)
    names = set(table.column_names)
    missing = [f.name for f in declared if f.name not in names]
    extra = sorted(names - set(declared.names))
    if missing:
        raise ArtifactError(f"{where}: {kind} table is missing column(s) {', '.join(missing)}")
    if extra:
        raise ArtifactError(f"{where}: {kind} table has unexpected column(s) {', '.join(extra)}")
    for field in declared:
        found = table.schema.field(field.name).type
        if found != field.type:
            raise ArtifactError(f"{where}: column {field.name} of {kind} should be {field.type}, found {found}")
        col = table.column(field.name)
        if not field.nullable and col.null_count:
            raise ArtifactError(f"{where}: column {field.name} of {kind} has {col.null_count} null value(s)")
        if _has_nan(col, field.type):
            raise ArtifactError(f"{where}: column {field.name} of {kind} contains NaN")
    return table.select(declared.names).cast(declared)


def table_from_rows(rows: list[dict], kind: str) -> pa.Table:
    """Build a table of the declared schema from row dicts (an empty list is allowed)."""
    schema = schema_for(kind)
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
        raise ArtifactError(f"cannot build {kind} table: {e}") from None


def _parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", store_schema=True)
    return buf.getvalue()


def write_table(uri: str, table: pa.Table, *, kind: str, stage: str, config_hash: str) -> Manifest:
    """Validate ``table`` against the declared schema of ``kind`` and publish it at ``uri``."""
    table = _check_schema(table, kind, uri)
    data = _parquet_bytes(table)  # serialize before publishing anything
    with publish_dir(uri, kind=kind, stage=stage, config_hash=config_hash, rows=table.num_rows) as staging:
        (staging / DATA).write_bytes(data)
    return read_manifest(uri)


def read_manifest(uri: str) -> Manifest:
    t = _target(uri)
    try:
        text = _call(t, f"download of {MANIFEST}", "cat_file", join(t.path, MANIFEST), missing_ok=True).decode()
    except FileNotFoundError:
        leftovers = t.fs.exists(t.path) if t.local else bool(_objects(t))
        if leftovers:
            raise ArtifactError(
                f"{uri}: no {MANIFEST}: the artifact was never published whole (was its stage interrupted?)"
            ) from None
        raise ArtifactError(f"{uri}: no artifact at this URI") from None
    except UnicodeDecodeError:
        raise ArtifactError(f"{uri}: {MANIFEST} is malformed (not UTF-8 text)") from None
    return Manifest.from_json(text, uri)


def _mismatch(uri: str, name: str, digest: str, expected: dict) -> ArtifactError:
    return ArtifactError(
        f"{uri}: {name} does not match its manifest (sha256 {digest[:12]}…, expected {expected['sha256'][:12]}…)"
    )


def _verified_bytes(t: _Target, name: str, expected: dict) -> bytes:
    try:
        data = _call(t, f"download of {name}", "cat_file", join(t.path, name), nbytes=expected.get("bytes", 0), missing_ok=True)
    except FileNotFoundError:
        raise ArtifactError(f"{t.uri}: {name} is listed in the manifest but missing") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected["sha256"]:
        raise _mismatch(t.uri, name, digest, expected)
    return data


def read_file(uri: str, name: str) -> bytes:
    """One file of a published artifact, verified against its manifest."""
    manifest = read_manifest(uri)
    if name not in manifest.files:
        raise ArtifactError(f"{uri}: {name} is not listed in its {MANIFEST}")
    return _verified_bytes(_target(uri), name, manifest.files[name])


def read_table(uri: str, *, kind: str) -> pa.Table:
    """Read a published table, verifying its manifest, hash, schema and row count."""
    manifest = read_manifest(uri)
    if manifest.kind != kind:
        raise ArtifactError(f"{uri}: expected a {kind} table, found a {manifest.kind} artifact")
    if manifest.schema_version != SCHEMA_VERSION:
        raise ArtifactError(f"{uri}: schema version {manifest.schema_version}, this ac2 reads {SCHEMA_VERSION}")
    if DATA not in manifest.files:
        raise ArtifactError(f"{uri}: manifest lists no {DATA}")
    data = _verified_bytes(_target(uri), DATA, manifest.files[DATA])
    try:
        # one file: ParquetFile reads it without pq.read_table's dataset layer, which imports
        # pandas (about 0.3 s of CPU in every fresh KFP task); the table is the same
        table = pq.ParquetFile(pa.BufferReader(data)).read()
    except (pa.ArrowInvalid, OSError) as e:
        raise ArtifactError(f"{uri}: {DATA} is not a readable Parquet file ({e})") from None
    table = _check_schema(table, kind, uri)
    if table.num_rows != manifest.rows:
        raise ArtifactError(f"{uri}: {table.num_rows} rows, manifest says {manifest.rows}")
    return table


def read_rows(uri: str, *, kind: str) -> list[dict]:
    return read_table(uri, kind=kind).to_pylist()


def content_hash(uri: str) -> str:
    return read_manifest(uri).content_hash


# ----------------------------------------------------------------------- models


def _refuse_pickle(files: list[str], uri: str) -> None:
    pickles = [f for f in files if f.endswith(PICKLE_SUFFIXES)]
    if pickles:
        raise ArtifactError(f"{uri}: pickle-format file(s) {', '.join(sorted(pickles))}; ac2 loads safetensors only")
    if not any(f.endswith(".safetensors") for f in files):
        raise ArtifactError(f"{uri}: no .safetensors weights in this model directory")


def _download_verified(t: _Target, name: str, expected: dict, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        _call(
            t, f"download of {name}", "get_file", join(t.path, name), str(dest), nbytes=expected.get("bytes", 0), missing_ok=True
        )
    except FileNotFoundError:
        raise ArtifactError(f"{t.uri}: {name} is listed in the manifest but missing") from None
    got = _sha256_file(dest)
    if got["sha256"] != expected["sha256"]:
        raise _mismatch(t.uri, name, got["sha256"], expected)


def local_model_dir(uri: str, *, kind: str, cache_dir: str | None = None) -> Path:
    """Verify a published model directory and return a local folder holding it.

    Local artifacts are verified in place. Remote ones are downloaded in parallel, file by
    file, into ``<cache_dir or $TMPDIR>/ac2-models/<content hash>``; every file is checked
    against the manifest before the folder appears under that name, so a cached folder is
    a verified one.
    """
    manifest = read_manifest(uri)
    if manifest.kind != kind:
        raise ArtifactError(f"{uri}: expected a {kind} model, found a {manifest.kind} artifact")
    _refuse_pickle(list(manifest.files), uri)
    t = _target(uri)
    if t.local:
        path = t.path
        present = [p.relative_to(path).as_posix() for p in Path(path).rglob("*") if p.is_file()]
        _refuse_pickle(present, uri)
        for name, expected in manifest.files.items():
            got = _sha256_file(Path(path, name)) if Path(path, name).exists() else None
            if got is None:
                raise ArtifactError(f"{uri}: {name} is listed in the manifest but missing")
            if got["sha256"] != expected["sha256"]:
                raise ArtifactError(f"{uri}: {name} does not match its manifest")
        return Path(path)
    _refuse_pickle(_objects(t), uri)  # also a pickle put beside the published files
    root = Path(cache_dir or tempfile.gettempdir()) / "ac2-models" / manifest.content_hash
    if (root / MANIFEST).exists() and (root / MANIFEST).read_text() == manifest.to_json():
        os.utime(root)  # most recently used: the last to be evicted
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".download-", dir=root.parent))
    try:
        jobs = [lambda n=n, e=e: _download_verified(t, n, e, staging / n) for n, e in sorted(manifest.files.items())]
        _in_parallel(jobs, t.section.io_threads)
        (staging / MANIFEST).write_text(manifest.to_json())
        if root.exists():  # a stale or partial folder of the same hash: the verified copy replaces it
            shutil.rmtree(root, ignore_errors=True)
        try:
            os.replace(staging, root)
        except OSError:
            if not (root / MANIFEST).exists():  # not another process that finished the same download first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _evict(root.parent, keep=t.section.model_cache_entries, current=root)
    return root


def _evict(cache: Path, *, keep: int, current: Path) -> None:
    """Keep the ``keep`` most recently used checkpoints of the download cache.

    Each iteration publishes new checkpoints, so without a bound the cache of a long
    run grows by two models an iteration (56 GB each for a 4B model with its optimizer).
    """
    entries = sorted(
        (p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".") and p != current),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in entries[keep - 1 :]:
        shutil.rmtree(old, ignore_errors=True)
