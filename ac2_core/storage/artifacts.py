"""Publishing an artifact whole, finding and removing artifacts, and reading them back verified.

A writer fills a temporary local folder (``publish_dir``); the artifact then appears in
one step. On a local disk that step is a rename of the folder, staged beside its target;
on an object store, which has no atomic rename, it is the upload of ``manifest.json``
after every data object, with the old manifest removed first, so no reader trusts a
half-replaced set. A reader trusts nothing without a manifest, and checks each file it
reads against the sha256 listed there.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ac2_core.schemas import SCHEMA_VERSION
from ac2_core.storage import lineage as lineage_
from ac2_core.storage.leftovers import REPLACED, aside_name, staging_prefix
from ac2_core.storage.manifest import MANIFEST, ArtifactError, Manifest
from ac2_core.storage.remote import call, in_parallel, objects
from ac2_core.storage.uris import Target, join, target


def exists(uri: str) -> bool:
    """True when a *published* artifact (one with a manifest) is at ``uri``."""
    t = target(uri)
    if t.local:
        return t.fs.exists(join(t.path, MANIFEST))
    try:
        call(t, f"lookup of {MANIFEST}", "info", join(t.path, MANIFEST), missing_ok=True)
        return True
    except FileNotFoundError:
        return False


def find_artifacts(root: str) -> list[str]:
    """URIs of every published artifact (a folder with a manifest) under ``root``, sorted; never one
    in a folder whose name begins with a dot (a staging or renamed-aside copy, ``leftovers``)."""
    t = target(root)
    base = t.path.rstrip("/")
    manifests = call(t, "listing", "glob", f"{base}/**/{MANIFEST}")
    folders = sorted(m[: -len(MANIFEST) - 1] for m in manifests)
    folders = [f for f in folders if not any(part.startswith(".") for part in f[len(base) :].split("/"))]
    return folders if t.local else [t.fs.unstrip_protocol(f) for f in folders]


def remove(uri: str) -> None:
    """Delete the artifact at ``uri``, manifest first, so that no reader trusts what is left meanwhile.

    A local folder is renamed aside first (``leftovers``): a removal that is killed halfway
    leaves a folder that the next run's sweep finds, not a half-deleted one at ``uri``.
    """
    t = target(uri, write=True)
    if t.local:
        path = Path(t.path)
        aside = path.parent / aside_name(path.name, REPLACED)
        try:
            path.rename(aside)
        except FileNotFoundError:
            return
        with contextlib.suppress(FileNotFoundError):
            (aside / MANIFEST).unlink()
        shutil.rmtree(aside, ignore_errors=True)
        return
    _remove_remote(t)


def _remove_remote(t: Target) -> None:
    with contextlib.suppress(FileNotFoundError):
        call(t, f"removal of the old {MANIFEST}", "rm_file", join(t.path, MANIFEST), missing_ok=True)
    stale = [join(t.path, name) for name in objects(t)]
    if stale:
        call(t, f"removal of {len(stale)} old file(s)", "rm", stale)


# ------------------------------------------------------------------- publishing


def sha256_file(path: Path) -> dict:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"sha256": h.hexdigest(), "bytes": path.stat().st_size}


def _describe(staging: Path, threads: int) -> dict[str, dict]:
    names = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
    # hashlib releases the GIL on large buffers, so shards hash in parallel
    hashes = in_parallel([lambda n=n: sha256_file(staging / n) for n in names], threads)
    return dict(zip(names, hashes))


def _publish_local(staging: Path, destination: Path) -> None:
    # staging is a sibling of the destination, so both renames stay on one file system.
    old = None
    if destination.exists() or destination.is_symlink():
        old = destination.parent / aside_name(destination.name, REPLACED)
        destination.rename(old)
    staging.rename(destination)  # the one step that makes the artifact visible
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _size(path: Path) -> int:
    return path.stat().st_size


def _publish_remote(t: Target, staging: Path, manifest: Callable[[dict[str, dict]], str]) -> None:
    # Object stores have no atomic directory rename: the manifest, written last, is the
    # commit point. The old manifest goes first, so no reader trusts a half-replaced set,
    # then every old object, so that a rerun leaves no file of the previous version behind.
    # The files are hashed while that removal and their uploads run (the staging folder no
    # longer changes), so hashing adds no time of its own; ``manifest`` gets the hashes.
    names = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
    with ThreadPoolExecutor(max_workers=max(1, min(t.section.io_threads, os.cpu_count() or 1))) as hashing:
        hashes = [hashing.submit(sha256_file, staging / n) for n in names]
        _remove_remote(t)
        uploads = [
            lambda n=n: call(t, f"upload of {n}", "put_file", str(staging / n), join(t.path, n), nbytes=_size(staging / n))
            for n in names
        ]
        in_parallel(uploads, t.section.io_threads)
        files = dict(zip(names, (h.result() for h in hashes)))
    call(t, f"upload of {MANIFEST}", "pipe_file", join(t.path, MANIFEST), manifest(files).encode())


@contextlib.contextmanager
def publish_dir(
    uri: str, *, kind: str, stage: str, config_hash: str, rows: int | None = None, lineage: dict | None = None
) -> Iterator[Path]:
    """Yield an empty local folder; when the block ends without error, publish it at ``uri``.

    On an exception nothing is published and whatever was at ``uri`` before stays. The
    manifest names ``lineage``, or else the inputs of the ``storage.lineage.recording`` block
    this runs in, if any.
    """
    t = target(uri, write=True)  # refuses a URI outside the artifact root, or without credentials
    parent = Path(t.path).parent if t.local else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    # named with this process (``leftovers``), so that a later run removes it if this one is killed
    staging = Path(tempfile.mkdtemp(prefix=staging_prefix(Path(t.path).name), dir=parent))
    try:
        yield staging
        if (staging / MANIFEST).exists():
            raise ArtifactError(f"{uri}: the writer must not create {MANIFEST} itself")
        recorded = lineage or lineage_.current()
        if parent is not None:
            files = _describe(staging, t.section.io_threads)
            manifest = Manifest(kind, stage, config_hash, SCHEMA_VERSION, rows, files, recorded)
            (staging / MANIFEST).write_text(manifest.to_json())
            _publish_local(staging, Path(t.path))
        else:
            _publish_remote(
                t, staging, lambda files: Manifest(kind, stage, config_hash, SCHEMA_VERSION, rows, files, recorded).to_json()
            )
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def copy(src: str, dst: str) -> None:
    """Republish the verified artifact at ``src`` under ``dst``, manifest fields unchanged."""
    m = read_manifest(src)
    with publish_dir(dst, kind=m.kind, stage=m.stage, config_hash=m.config_hash, rows=m.rows, lineage=m.lineage) as folder:
        for name in m.files:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(read_file(src, name))


def move(src: str, dst: str) -> None:
    """Publish the artifact at ``src`` under ``dst`` by renaming its folder; nothing is left at ``src``.

    Local paths on one file system only (a kfp.local pipeline root and its run folder):
    the rename is the step that publishes, as for ``publish_dir``.
    """
    s, d = target(src), target(dst, write=True)
    if not (s.local and d.local):
        raise ArtifactError(f"{src}: only an artifact on a local disk can be moved (to {dst})")
    read_manifest(src)  # a published artifact, nothing less
    Path(d.path).parent.mkdir(parents=True, exist_ok=True)
    _publish_local(Path(s.path), Path(d.path))


# ---------------------------------------------------------------------- reading


def read_manifest(uri: str) -> Manifest:
    t = target(uri)
    try:
        text = call(t, f"download of {MANIFEST}", "cat_file", join(t.path, MANIFEST), missing_ok=True).decode()
    except FileNotFoundError:
        leftovers = t.fs.exists(t.path) if t.local else bool(objects(t))
        if leftovers:
            raise ArtifactError(
                f"{uri}: no {MANIFEST}: the artifact was never published whole (was its stage interrupted?)"
            ) from None
        raise ArtifactError(f"{uri}: no artifact at this URI") from None
    except UnicodeDecodeError:
        raise ArtifactError(f"{uri}: {MANIFEST} is malformed (not UTF-8 text)") from None
    return Manifest.from_json(text, uri)


def mismatch(uri: str, name: str, digest: str, expected: dict) -> ArtifactError:
    return ArtifactError(
        f"{uri}: {name} does not match its manifest (sha256 {digest[:12]}…, expected {expected['sha256'][:12]}…)"
    )


def verified_bytes(t: Target, name: str, expected: dict) -> bytes:
    try:
        data = call(t, f"download of {name}", "cat_file", join(t.path, name), nbytes=expected.get("bytes", 0), missing_ok=True)
    except FileNotFoundError:
        raise ArtifactError(f"{t.uri}: {name} is listed in the manifest but missing") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected["sha256"]:
        raise mismatch(t.uri, name, digest, expected)
    return data


def read_file(uri: str, name: str) -> bytes:
    """One file of a published artifact, verified against its manifest."""
    manifest = read_manifest(uri)
    if name not in manifest.files:
        raise ArtifactError(f"{uri}: {name} is not listed in its {MANIFEST}")
    return verified_bytes(target(uri), name, manifest.files[name])


def content_hash(uri: str) -> str:
    return read_manifest(uri).content_hash
