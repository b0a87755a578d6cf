"""Artifacts at fsspec URIs: tables and model directories, published whole or not at all.

Every artifact is a directory:

    <uri>/data.parquet      (tables)   or the files of an HF model directory
    <uri>/manifest.json     written last: kind, schema version, rows, sha256 of every file

Writers stage everything in a temporary sibling and publish it in one step, so a crash
leaves nothing at ``<uri>`` that a reader would take. Readers verify the manifest
(kind, schema version, row count, every file's hash) before trusting the data. The
manifest holds no timestamp, so a rerun on the same inputs gives identical bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ac2_core.schemas import SCHEMA_VERSION, schema_for

MANIFEST = "manifest.json"
DATA = "data.parquet"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


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


# --------------------------------------------------------------------------- URIs


def _fs(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    try:
        return fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as e:
        raise ArtifactError(f"{uri}: unsupported URI ({e})") from None


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])


def exists(uri: str) -> bool:
    """True when a *published* artifact (one with a manifest) is at ``uri``."""
    fs, path = _fs(uri)
    return fs.exists(join(path, MANIFEST))


# ------------------------------------------------------------------- publishing


def _sha256_file(path: Path) -> dict:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"sha256": h.hexdigest(), "bytes": path.stat().st_size}


def _describe(staging: Path) -> dict[str, dict]:
    files = {}
    for p in sorted(staging.rglob("*")):
        if p.is_file():
            files[p.relative_to(staging).as_posix()] = _sha256_file(p)
    return files


def _publish_local(staging: Path, target: Path) -> None:
    # staging is a sibling of target, so both renames stay on one file system.
    old = None
    if target.exists() or target.is_symlink():
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        target.rename(old)
    staging.rename(target)  # the one step that makes the artifact visible
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _publish_remote(fs: fsspec.AbstractFileSystem, staging: Path, path: str, manifest_text: str) -> None:
    # Object stores have no atomic directory rename: the manifest, written last, is the
    # commit point. Remove the old manifest first so no reader trusts a half-replaced set.
    if fs.exists(join(path, MANIFEST)):
        fs.rm(join(path, MANIFEST))
    if fs.exists(path):
        fs.rm(path, recursive=True)
    for p in sorted(staging.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            fs.put_file(str(p), join(path, p.relative_to(staging).as_posix()))
    with fs.open(join(path, MANIFEST), "w") as f:
        f.write(manifest_text)


@contextlib.contextmanager
def publish_dir(uri: str, *, kind: str, stage: str, config_hash: str, rows: int | None = None) -> Iterator[Path]:
    """Yield an empty local folder; when the block ends without error, publish it at ``uri``.

    On an exception nothing is published and whatever was at ``uri`` before stays.
    """
    fs, path = _fs(uri)
    parent = Path(path).parent if _is_local(fs) else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{Path(path).name}.staging-", dir=parent))
    try:
        yield staging
        if (staging / MANIFEST).exists():
            raise ArtifactError(f"{uri}: the writer must not create {MANIFEST} itself")
        manifest = Manifest(kind, stage, config_hash, SCHEMA_VERSION, rows, _describe(staging))
        (staging / MANIFEST).write_text(manifest.to_json())
        if parent is not None:
            _publish_local(staging, Path(path))
        else:
            _publish_remote(fs, staging, path, manifest.to_json())
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
    fs, path = _fs(uri)
    try:
        with fs.open(join(path, MANIFEST), "r") as f:
            text = f.read()
    except FileNotFoundError:
        if fs.exists(path):
            raise ArtifactError(
                f"{uri}: no {MANIFEST}: the artifact was never published whole (was its stage interrupted?)"
            ) from None
        raise ArtifactError(f"{uri}: no artifact at this URI") from None
    return Manifest.from_json(text, uri)


def _verified_bytes(fs, path: str, name: str, expected: dict, uri: str) -> bytes:
    try:
        with fs.open(join(path, name), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ArtifactError(f"{uri}: {name} is listed in the manifest but missing") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected["sha256"]:
        raise ArtifactError(f"{uri}: {name} does not match its manifest (sha256 {digest[:12]}…, expected {expected['sha256'][:12]}…)")
    return data


def read_table(uri: str, *, kind: str) -> pa.Table:
    """Read a published table, verifying its manifest, hash, schema and row count."""
    manifest = read_manifest(uri)
    if manifest.kind != kind:
        raise ArtifactError(f"{uri}: expected a {kind} table, found a {manifest.kind} artifact")
    if manifest.schema_version != SCHEMA_VERSION:
        raise ArtifactError(f"{uri}: schema version {manifest.schema_version}, this ac2 reads {SCHEMA_VERSION}")
    if DATA not in manifest.files:
        raise ArtifactError(f"{uri}: manifest lists no {DATA}")
    fs, path = _fs(uri)
    data = _verified_bytes(fs, path, DATA, manifest.files[DATA], uri)
    try:
        table = pq.read_table(pa.BufferReader(data))
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


def local_model_dir(uri: str, *, kind: str, cache_dir: str | None = None) -> Path:
    """Verify a published model directory and return a local folder holding it.

    Local artifacts are verified in place; remote ones are downloaded and verified.
    """
    manifest = read_manifest(uri)
    if manifest.kind != kind:
        raise ArtifactError(f"{uri}: expected a {kind} model, found a {manifest.kind} artifact")
    _refuse_pickle(list(manifest.files), uri)
    fs, path = _fs(uri)
    if _is_local(fs):
        present = [p.relative_to(path).as_posix() for p in Path(path).rglob("*") if p.is_file()]
        _refuse_pickle(present, uri)
        for name, expected in manifest.files.items():
            got = _sha256_file(Path(path, name)) if Path(path, name).exists() else None
            if got is None:
                raise ArtifactError(f"{uri}: {name} is listed in the manifest but missing")
            if got["sha256"] != expected["sha256"]:
                raise ArtifactError(f"{uri}: {name} does not match its manifest")
        return Path(path)
    root = Path(cache_dir or tempfile.gettempdir()) / "ac2-models" / manifest.content_hash
    if not (root / MANIFEST).exists():
        staging = Path(tempfile.mkdtemp(prefix=".download-", dir=root.parent if root.parent.exists() else None))
        try:
            for name, expected in manifest.files.items():
                dest = staging / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(_verified_bytes(fs, path, name, expected, uri))
            (staging / MANIFEST).write_text(manifest.to_json())
            root.parent.mkdir(parents=True, exist_ok=True)
            if not root.exists():
                os.replace(staging, root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return root
