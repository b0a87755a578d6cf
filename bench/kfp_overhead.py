"""Per-task orchestration overhead of kfp.local: the seconds each task spends outside its
stage function (process start, imports, kfp's executor, artifact bookkeeping).

    nice -n 5 .venv/bin/python bench/kfp_overhead.py [--config toy|tiny] [--out DIR]

Bootstraps once (not measured), then runs one iteration through kfp.local and the same
iteration through the inprocess runner on the same artifacts. For each task:

    wall      from kfp.local's "Executing task" to "finished" log lines (ms resolution)
    stage     ``stage_seconds`` its component wrote into the output metadata
    overhead  wall - stage
    imports   a fresh ``python -c "import kfp.dsl.executor_main, components.io, <stage module>"``
              with ``_KFP_RUNTIME=true`` as in a task (kfp then skips its client), wall and CPU

and for the whole iteration the CPU seconds (user + system) of all kfp.local task processes
against the inprocess runner's: on a shared machine CPU time moves far less with the load
than wall time does.

Writes bench/results/kfp_overhead.md. Not a test: numbers depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ac2_core.models.store import ModelStore  # noqa: E402
from ac2_core.stages import inprocess  # noqa: E402
from ac2_core.stages.layout import STAGES, RunLayout  # noqa: E402
from pipelines import driver, local  # noqa: E402

TOY = ROOT / "pipelines" / "configs" / "toy.yaml"
LINE = re.compile(r"^(\d\d):(\d\d):(\d\d\.\d+) - INFO - (Executing task|Task) '([\w-]+)'(?: finished with status (\w+))?")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
GOAL_S = 1.5


def load(which: str):
    from ac2_core.config import load_config

    match which:
        case "toy":  # the toy model and task; warm start off: it changes no per-task cost
            return load_config(
                TOY, {"warm_start.max_steps": 0, "run.iterations": 1}
            ), "toy (warm_start.max_steps=0, run.iterations=1)"
        case "tiny":
            from tests.conftest import tiny_config

            return tiny_config(run__iterations=1), "tiny (tests.conftest.tiny_config, run.iterations=1)"
    raise SystemExit(f"--config must be toy or tiny; found {which}")


def task_walls(log_file: Path) -> dict[str, float]:
    """Seconds between each task's "Executing task" and "finished" lines in a kfp.local log."""
    started, walls = {}, {}
    for raw in log_file.read_text().splitlines():
        m = LINE.match(ANSI.sub("", raw))
        if not m:
            continue
        t = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
        if m.group(4) == "Executing task":
            started[m.group(5)] = t
        elif m.group(6):
            walls[m.group(5)] = (t - started.pop(m.group(5))) % 86400
    return walls


def stage_seconds(run_dir: Path) -> dict[str, float]:
    """``stage_seconds`` from each task's executor output (every output carries the same value)."""
    out = {}
    for f in run_dir.glob("*/executor_output.json"):
        for art in json.loads(f.read_text())["artifacts"].values():
            meta = art["artifacts"][0]["metadata"]
            if "stage_seconds" in meta:
                out[f.parent.name] = meta["stage_seconds"]
    return out


def import_seconds(module: str, repeats: int = 3) -> tuple[float, float]:
    """Best-of (wall, CPU) seconds of a fresh interpreter that imports what a task of ``module`` imports."""
    return _timed([sys.executable, "-c", f"import kfp.dsl.executor_main, components.io, {module}"], repeats)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="toy", help="toy (default) or tiny")
    p.add_argument("--out", help="work folder (default: a temporary one)")
    args = p.parse_args()
    cfg, described = load(args.config)
    work = Path(args.out or tempfile.mkdtemp(prefix="ac2-kfp-overhead-")).resolve()
    root = work / "kfp"
    print(f"config: {described}; work folder {work}", flush=True)

    from pipelines.dag import bootstrap_pipeline, iteration_pipeline

    local._init(root)
    t0 = time.perf_counter()
    boot = local.run_pipeline(bootstrap_pipeline, {"config_json": cfg.to_json()}, root, "bootstrap")
    print(f"bootstrap (not measured): {time.perf_counter() - t0:.1f}s", flush=True)

    load_start = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), _children_cpu()
    outs = local.run_pipeline(iteration_pipeline, driver.iteration_arguments(cfg, boot, None, 1), root, "iter-0001")
    kfp_iteration, kfp_cpu = time.perf_counter() - t0, _children_cpu() - c0
    walls = task_walls(root / "logs" / "iter-0001.log")
    stage = stage_seconds(Path(outs["actor"]).parents[1])

    # the same iteration in one process, on a copy of the same bootstrap
    layout = RunLayout(str(work / "inprocess"))
    for name, uri in boot.items():
        Path(layout.bootstrap(name)).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-r", uri, layout.bootstrap(name)], check=True)
    t0, c0 = time.perf_counter(), time.process_time()
    inproc = inprocess.run_iteration(cfg, layout, 1, ModelStore(cfg, keep_in_memory=True))["seconds"]
    inprocess_iteration, inprocess_cpu = time.perf_counter() - t0, time.process_time() - c0

    python_start = _timed([sys.executable, "-c", "pass"])
    kfp_start = _timed([sys.executable, "-c", "import kfp.dsl.executor_main"])
    rows = []
    for task in ["config", *[s.replace("_", "-") for s in STAGES]]:
        if task not in walls:
            continue
        name = task.replace("-", "_")
        module = "ac2_core.config" if name == "config" else f"ac2_core.stages.{name}"
        imports = import_seconds(module)
        rows.append((name, walls[task], stage.get(task, 0.0), imports, inproc.get(name)))

    lines = [
        "# kfp.local per-task overhead",
        "",
        f"Config: {described}. Machine: {os.cpu_count()} CPUs, load average {load_start:.2f} when the kfp.local"
        f" iteration started, {os.getloadavg()[0]:.2f} at the end.",
        f"Reproduce: `nice -n 5 .venv/bin/python bench/kfp_overhead.py --config {args.config}`",
        "",
        "overhead = task wall time (kfp.local log) - time inside the stage function (`stage_seconds` metadata).",
        "imports = a fresh interpreter importing kfp's executor, components.io and the stage module, as a task does"
        f" (`_KFP_RUNTIME=true`); wall and CPU, best of 3 (bare `python -c pass`: {python_start[0]:.2f}s wall;"
        f" with kfp's executor: {kfp_start[0]:.2f}s wall, {kfp_start[1]:.2f}s CPU). A task imports more at run time"
        " (transformers' model code where a model is loaded).",
        "",
        "| task | wall s | stage s | overhead s | of which imports s (CPU s) | inprocess stage s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, wall, st, (imp, imp_cpu), ip in rows:
        ip_s = "" if ip is None else f"{ip:.2f}"
        lines.append(f"| {name} | {wall:.2f} | {st:.2f} | {wall - st:.2f} | {imp:.2f} ({imp_cpu:.2f}) | {ip_s} |")
    overheads = [wall - st for _, wall, st, _, _ in rows]
    total = sum(overheads)
    lines += [
        "",
        f"- tasks: {len(rows)}; mean overhead {total / len(rows):.2f}s per task (goal < {GOAL_S}s), max {max(overheads):.2f}s",
        f"- overhead share of the kfp.local iteration: {total:.1f}s of {kfp_iteration:.1f}s = {total / kfp_iteration:.0%}",
        f"- the same iteration inprocess: {inprocess_iteration:.1f}s"
        f" (kfp.local / inprocess = {kfp_iteration / inprocess_iteration:.1f}x)",
        f"- CPU seconds of the iteration: kfp.local tasks {kfp_cpu:.1f}s, inprocess {inprocess_cpu:.1f}s;"
        f" the difference, {(kfp_cpu - inprocess_cpu) / len(rows):.2f}s per task, is the overhead in CPU time",
        f"- a fresh interpreter's imports alone take {sum(i[0] for *_, i, _ in rows) / len(rows):.2f}s wall,"
        f" {sum(i[1] for *_, i, _ in rows) / len(rows):.2f}s CPU per task on average",
    ]
    report = "\n".join(lines) + "\n"
    print("\n" + report)
    out = ROOT / "bench" / "results" / "kfp_overhead.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    print(f"wrote {out}")


def _timed(cmd: list[str], repeats: int = 3) -> tuple[float, float]:
    """Best-of (wall, CPU) seconds of ``cmd``, run as a task's process (``_KFP_RUNTIME=true``)."""
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), _children_cpu()
        subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "_KFP_RUNTIME": "true"})
        walls.append(time.perf_counter() - t0)
        cpus.append(_children_cpu() - c0)
    return min(walls), min(cpus)


if __name__ == "__main__":
    main()
