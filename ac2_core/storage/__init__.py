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
Remote requests are retried within bounds (``remote``).

The modules, each behind this one import:

    manifest    the manifest and ArtifactError
    active      the storage section in effect (``using``)
    uris        URIs to file systems; S3 endpoint and credentials; the artifact root
    remote      bounded retries, parallel transfers
    artifacts   publish, copy, move, remove, find; manifests and files read back verified
    leftovers   what a killed publish leaves (staging, renamed-aside folders), named to be swept
    exclusive   a small file created only if absent (a run folder's lock on an object store)
    tables      Parquet tables of a declared schema
    models      model directories: verified, no pickle, a local cache of remote ones
    lineage     the inputs a stage read, named in the manifests it publishes
    files       a run folder's plain files (no manifest): config record, summary, timings
"""

from ac2_core.storage.active import settings, using
from ac2_core.storage.artifacts import (
    content_hash,
    copy,
    exists,
    find_artifacts,
    move,
    publish_dir,
    read_file,
    read_manifest,
    remove,
)
from ac2_core.storage.files import put_file, read_text, write_text
from ac2_core.storage.leftovers import remove_leftovers, remove_temp_leftovers
from ac2_core.storage.manifest import MANIFEST, ArtifactError, Manifest
from ac2_core.storage.models import PICKLE_SUFFIXES, local_model_dir
from ac2_core.storage.tables import DATA, read_rows, read_table, table_from_rows, write_table
from ac2_core.storage.uris import join

__all__ = [
    "DATA",
    "MANIFEST",
    "PICKLE_SUFFIXES",
    "ArtifactError",
    "Manifest",
    "content_hash",
    "copy",
    "exists",
    "find_artifacts",
    "join",
    "local_model_dir",
    "move",
    "publish_dir",
    "put_file",
    "read_file",
    "read_manifest",
    "read_rows",
    "read_table",
    "read_text",
    "remove",
    "remove_leftovers",
    "remove_temp_leftovers",
    "settings",
    "table_from_rows",
    "using",
    "write_table",
    "write_text",
]
