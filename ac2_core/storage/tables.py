"""Tables: Parquet files of a declared schema (``ac2_core.schemas``), checked on write and on read."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ac2_core.schemas import SCHEMA_VERSION, schema_for
from ac2_core.storage.artifacts import publish_dir, read_manifest, verified_bytes
from ac2_core.storage.manifest import ArtifactError, Manifest
from ac2_core.storage.uris import target

DATA = "data.parquet"


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


def _arrow_owned(data: bytes) -> pa.Buffer:
    """``data`` copied into memory that Arrow allocated, for Arrow to read.

    Arrow's reading threads hold slices of the buffer they read and may drop the last one after
    ``read`` has returned. Freeing a buffer over a Python object takes the GIL, and Python ends a
    thread that asks for it while the interpreter finalizes (``pthread_exit``), here inside a
    noexcept destructor: the process aborts once its work is done ("terminate called without an
    active exception", rc 134; kfp.local's evaluate task reads two tables just before it exits).
    Arrow frees its own memory without the GIL. The copy costs less than the hash already taken.
    """
    buffer = pa.allocate_buffer(len(data))
    memoryview(buffer).cast("B")[:] = data
    return buffer


def read_table(uri: str, *, kind: str) -> pa.Table:
    """Read a published table, verifying its manifest, hash, schema and row count."""
    manifest = read_manifest(uri)
    if manifest.kind != kind:
        raise ArtifactError(f"{uri}: expected a {kind} table, found a {manifest.kind} artifact")
    if manifest.schema_version != SCHEMA_VERSION:
        raise ArtifactError(f"{uri}: schema version {manifest.schema_version}, this ac2 reads {SCHEMA_VERSION}")
    if DATA not in manifest.files:
        raise ArtifactError(f"{uri}: manifest lists no {DATA}")
    data = verified_bytes(target(uri), DATA, manifest.files[DATA])
    try:
        # one file: ParquetFile reads it without pq.read_table's dataset layer, which imports
        # pandas (about 0.3 s of CPU in every fresh KFP task); the table is the same
        table = pq.ParquetFile(pa.BufferReader(_arrow_owned(data))).read()
    except Exception as e:  # noqa: BLE001 - whatever the bytes make Arrow raise, it is this artifact's flaw
        raise ArtifactError(f"{uri}: {DATA} is not a readable Parquet file ({type(e).__name__}: {e})") from None
    try:
        table = _check_schema(table, kind, uri)
    except (pa.ArrowException, ValueError, TypeError) as e:  # a cast the declared types do not allow
        raise ArtifactError(f"{uri}: {DATA} does not fit the {kind} schema ({type(e).__name__}: {e})") from None
    if table.num_rows != manifest.rows:
        raise ArtifactError(f"{uri}: {table.num_rows} rows, manifest says {manifest.rows}")
    return table


def read_rows(uri: str, *, kind: str) -> list[dict]:
    return read_table(uri, kind=kind).to_pylist()
