"""Model directories: verified before use, pickle refused, remote ones cached locally by content hash."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from fsspec.asyn import AsyncFileSystem, sync

from ac2_core.storage.artifacts import mismatch, read_manifest, sha256_file
from ac2_core.storage.leftovers import DOWNLOAD, staging_prefix
from ac2_core.storage.manifest import MANIFEST, ArtifactError
from ac2_core.storage.remote import call, in_parallel, objects
from ac2_core.storage.uris import Target, join, target

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def _refuse_pickle(files: list[str], uri: str) -> None:
    pickles = [f for f in files if f.endswith(PICKLE_SUFFIXES)]
    if pickles:
        raise ArtifactError(f"{uri}: pickle-format file(s) {', '.join(sorted(pickles))}; ac2 loads safetensors only")
    if not any(f.endswith(".safetensors") for f in files):
        raise ArtifactError(f"{uri}: no .safetensors weights in this model directory")


CHUNK = 1 << 22  # bytes hashed and written at a time while the next ones arrive


def _download_verified(t: Target, name: str, expected: dict, dest: Path) -> None:
    """Download one file and check it against the manifest: hashed as it arrives where the file
    system streams (s3fs), so that no second pass over the file follows the transfer."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    size = expected.get("bytes", 0)
    try:
        if isinstance(t.fs, AsyncFileSystem) and hasattr(t.fs, "open_async"):
            digest = call(t, f"download of {name}", _get_hashed, t.fs, join(t.path, name), dest, nbytes=size, missing_ok=True)
        else:
            call(t, f"download of {name}", "get_file", join(t.path, name), str(dest), nbytes=size, missing_ok=True)
            digest = sha256_file(dest)["sha256"]
    except FileNotFoundError:
        raise ArtifactError(f"{t.uri}: {name} is listed in the manifest but missing") from None
    if digest != expected["sha256"]:
        raise mismatch(t.uri, name, digest, expected)


def _get_hashed(fs: AsyncFileSystem, path: str, dest: Path, timeout: float | None = None) -> str:
    """One attempt: stream ``path`` into ``dest`` (written afresh) and return the sha256 of what was written."""
    return sync(fs.loop, _stream_hashed, fs, path, dest, timeout=timeout)


async def _stream_hashed(fs: AsyncFileSystem, path: str, dest: Path) -> str:
    # one GET; each chunk is hashed and written on a thread while the next one arrives
    h = hashlib.sha256()
    loop = asyncio.get_running_loop()
    src = await fs.open_async(path, "rb")
    with open(dest, "wb") as out:

        def absorb(data: bytes) -> None:
            h.update(data)
            out.write(data)

        pending, buf = None, bytearray()
        while True:
            chunk = await src.read(CHUNK)
            buf += chunk
            if buf and (len(buf) >= CHUNK or not chunk):
                if pending is not None:
                    await pending
                pending = loop.run_in_executor(None, absorb, bytes(buf))
                buf = bytearray()
            if not chunk:
                break
        if pending is not None:
            await pending
    return h.hexdigest()


def _verify_in_place(uri: str, path: str, files: dict[str, dict]) -> Path:
    present = [p.relative_to(path).as_posix() for p in Path(path).rglob("*") if p.is_file()]
    _refuse_pickle(present, uri)
    for name, expected in files.items():
        got = sha256_file(Path(path, name)) if Path(path, name).exists() else None
        if got is None:
            raise ArtifactError(f"{uri}: {name} is listed in the manifest but missing")
        if got["sha256"] != expected["sha256"]:
            raise ArtifactError(f"{uri}: {name} does not match its manifest")
    return Path(path)


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
    t = target(uri)
    if t.local:
        return _verify_in_place(uri, t.path, manifest.files)
    _refuse_pickle(objects(t), uri)  # also a pickle put beside the published files
    root = Path(cache_dir or tempfile.gettempdir()) / "ac2-models" / manifest.content_hash
    if (root / MANIFEST).exists() and (root / MANIFEST).read_text() == manifest.to_json():
        os.utime(root)  # most recently used: the last to be evicted
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=staging_prefix("", DOWNLOAD), dir=root.parent))
    try:
        jobs = [lambda n=n, e=e: _download_verified(t, n, e, staging / n) for n, e in sorted(manifest.files.items())]
        in_parallel(jobs, t.section.io_threads)
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
