"""One toy iteration with and without a competing busy process: how much a background job slows ac2.

    nice -n 5 .venv/bin/python bench/contention.py [--repeats 3] [--runners inprocess,kfp] [--baseline]

Bootstraps once (not measured; ``warm_start.max_steps=0 critic.read_steps=0`` unless ``--set`` says otherwise, or
``--bootstrap-from`` a run folder of the same settings), then runs iteration 1 on a fresh copy
of that bootstrap, each time in a new process, as ``ac2 run`` would:

    inprocess   ``InProcess.iteration`` (its models load from the bootstrap's files)
    kfp         ``KfpLocal.iteration`` with a warm task host, started and ready before the clock starts

once with 0 competitors and once beside 1 competitor: ``python -c "while True: pass"``, a
CPU-bound process at this process's niceness, started just before the iteration and killed after it.
Other work on the machine is neither stopped nor counted as a competitor: the report records
the load average before each run, and ``--note`` says what else ran.
slowdown = iteration wall time with the competitor / without it, medians over ``--repeats``,
every combination interleaved within each repeat so that all see the same background load.
On C cores, fair sharing with one competitor costs C/(C-1) at most when ac2 keeps every core
busy (2x on 2 cores).

``--baseline`` adds GNU OpenMP's own wait policy (``GOMP_SPINCOUNT=300000``, what libgomp
uses when nothing is set; ac2 sets ``OMP_WAIT_POLICY=PASSIVE``, ``ac2_core.threads``), so the
report shows both. Every run writes the same iteration: the report says whether every run's
artifacts were byte-identical.

Writes bench/results/contention.md. Not a test: the numbers depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ac2_core import storage  # noqa: E402
from ac2_core.config import config_from_json, load_config  # noqa: E402
from ac2_core.runner import loop  # noqa: E402
from ac2_core.runner.layout import RunLayout  # noqa: E402
from ac2_core.threads import choose_threads  # noqa: E402
from bench._common import prepare_bootstrap, publish  # noqa: E402
from bench.artifact_hashes import artifacts  # noqa: E402

TOY = ROOT / "pipelines" / "configs" / "toy.yaml"
RESULTS = ROOT / "bench" / "results" / "contention.md"
SPIN = "while True: pass"
POLICIES = {
    "ac2": {},  # ac2_core.threads: passive waits
    "spin": {"GOMP_SPINCOUNT": "300000"},  # libgomp's default when nothing is set (about 3 ms of spinning per wait)
}


def child(runner: str, config_file: str, run_dir: str) -> None:
    """Time iteration 1 in this process; print the seconds as JSON on the last line."""
    cfg = config_from_json(Path(config_file).read_text())
    layout = RunLayout(run_dir)
    with storage.using(cfg.storage):
        match runner:
            case "inprocess":
                from ac2_core.runner.inprocess import InProcess

                t0 = time.perf_counter()
                InProcess(cfg, log=lambda _: None).iteration(cfg, layout, 1)
                wall = time.perf_counter() - t0
            case "kfp":
                from pipelines import local, taskhost

                root = Path(run_dir) / "kfp"
                with local.warm_task_host(root / "logs" / "taskhost.log") as address:
                    taskhost.wait_ready(address)
                    kfp = local.KfpLocal(cfg, root, layout)
                    t0 = time.perf_counter()
                    kfp.iteration(cfg, layout, 1)
                    wall = time.perf_counter() - t0
            case other:
                raise SystemExit(f"unknown runner {other!r}")
    print(json.dumps({"wall": wall}))


def measure(args, cfg, config_file: Path, boot: str, work: Path, runner: str, policy: str, competitors: int, n: int) -> dict:
    """One iteration in a fresh process, beside ``competitors`` busy processes."""
    run_dir = work / f"{runner}-{policy}-{competitors}-{n}"
    loop.adopt_bootstrap(cfg, RunLayout(str(run_dir)), boot)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(POLICIES[policy])
    if policy == "ac2":
        env["OMP_WAIT_POLICY"] = "PASSIVE"  # what importing ac2_core sets when nothing is
    load = os.getloadavg()[0]
    busy = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(competitors)]
    try:
        cmd = [sys.executable, __file__, "--child", runner, str(config_file), str(run_dir)]
        out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    if out.returncode != 0:
        raise SystemExit(f"{runner} ({policy}, {competitors} competing) failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    wall = json.loads(out.stdout.strip().splitlines()[-1])["wall"]
    hashes = {name: storage.content_hash(uri) for name, uri in artifacts(run_dir).items() if name.startswith("iter-")}
    print(f"  {runner:<9} {policy:<4} competitors {competitors}: {wall:6.1f}s  (load {load:.2f})", flush=True)
    return {"wall": wall, "load": load, "hashes": hashes}


def report(args, cfg_text: str, results: dict, started: float, loads: tuple[float, float]) -> str:
    cores = len(os.sched_getaffinity(0))
    hashes = [r["hashes"] for runs in results.values() for r in runs]
    same = all(h == hashes[0] for h in hashes)
    cmd = "nice -n 5 .venv/bin/python bench/contention.py " + shlex.join(sys.argv[1:])
    lines = [
        "# One toy iteration beside a competing busy process",
        "",
        f"Reproduce: `{cmd.strip()}`",
        "",
        f"Config: {cfg_text}. Machine: {cores} CPUs, load average {loads[0]:.2f} at the start and {loads[1]:.2f} at the"
        f" end (other work included); this process ran at niceness {os.nice(0)}, its iterations and competitors as"
        f" its children. Threads: {choose_threads(None)}. Whole benchmark: {time.perf_counter() - started:.0f}s.",
        "",
        *([f"Other load: {args.note}", ""] if args.note else []),
        "Each cell: median wall seconds of iteration 1 over the repeats [min–max], each in a fresh process; the load"
        " average (1 min) before each run is listed below. Competitor: `python -c 'while True: pass'`.",
        "",
        "| runner | OpenMP waits | 0 competitors s | 1 competitor s | slowdown |",
        "|---|---|---:|---:|---:|",
    ]
    for runner in args.runners:
        for policy in args.policies:
            idle, busy = results[(runner, policy, 0)], results[(runner, policy, 1)]
            a, b = statistics.median(r["wall"] for r in idle), statistics.median(r["wall"] for r in busy)
            span = lambda rs: f"{min(r['wall'] for r in rs):.1f}–{max(r['wall'] for r in rs):.1f}"  # noqa: E731
            name = "passive (ac2)" if policy == "ac2" else "spin (libgomp's default)"
            lines.append(f"| {runner} | {name} | {a:.1f} [{span(idle)}] | {b:.1f} [{span(busy)}] | **{b / a:.2f}x** |")
    lines += [
        "",
        f"Fair sharing with one competitor on {cores} cores: {cores / max(cores - 1, 1):.1f}x at most.",
        f"Artifacts of iteration 1 byte-identical across all {len(hashes)} runs (content hashes): {'yes' if same else 'NO'}.",
        "",
        "Load average (1 min) before each run, in run order: "
        + ", ".join(f"{r['load']:.1f}" for r in sorted((r for rs in results.values() for r in rs), key=lambda r: r["order"])),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="runs of each combination (default 3)")
    p.add_argument("--runners", default="inprocess,kfp", help="inprocess, kfp or both (default both)")
    p.add_argument("--baseline", action="store_true", help="also run with libgomp's spinning waits")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override, as for ac2 run")
    p.add_argument("--bootstrap-from", help="adopt this run folder's bootstrap (same settings) instead of making one")
    p.add_argument("--out", help="work folder (default: a temporary one)")
    p.add_argument("--note", default="", help="what else ran on the machine, for the report")
    args = p.parse_args()
    args.runners = [r for r in args.runners.split(",") if r]
    if not args.runners or set(args.runners) - {"inprocess", "kfp"}:
        p.error(f"--runners: expected inprocess and/or kfp, found {args.runners}")
    args.policies = ["ac2", "spin"] if args.baseline else ["ac2"]

    from pipelines.cli import _overrides

    started, load_start = time.perf_counter(), os.getloadavg()[0]
    overrides = {"warm_start.max_steps": 0, "critic.read_steps": 0, "run.iterations": 1, **_overrides(args.set)}
    cfg = load_config(TOY, overrides)
    cfg_text = "toy with " + ", ".join(f"`{k}={v}`" for k, v in overrides.items())
    work = Path(args.out or tempfile.mkdtemp(prefix="ac2-contention-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder {work}; load average {load_start:.2f}", flush=True)
    config_file = work / "config.json"
    config_file.write_text(cfg.to_json())
    boot = RunLayout(str(work / "boot"))
    prepare_bootstrap(cfg, boot, args.bootstrap_from)

    results: dict[tuple, list[dict]] = {}
    order = 0
    for n in range(args.repeats):
        print(f"repeat {n + 1} of {args.repeats}", flush=True)
        for runner in args.runners:
            for policy in args.policies:
                for competitors in (0, 1):
                    r = measure(args, cfg, config_file, boot.root, work, runner, policy, competitors, n)
                    r["order"], order = order, order + 1
                    results.setdefault((runner, policy, competitors), []).append(r)
    publish(report(args, cfg_text, results, started, (load_start, os.getloadavg()[0])), RESULTS)


if __name__ == "__main__":
    main()
