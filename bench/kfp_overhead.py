"""Per-task orchestration overhead of kfp.local: the seconds each task spends outside its
stage function (process start, imports, kfp's executor, artifact bookkeeping).

    nice -n 10 .venv/bin/python bench/kfp_overhead.py [--config toy|tiny] [--repeats 3] [--out DIR]

Bootstraps once (not measured), then runs the same first iteration on the same artifacts
three ways: through kfp.local with cold tasks (every task imports the stage code itself,
as on a cluster), through kfp.local with the warm task host (``pipelines.taskhost``, the
default of ``ac2 run``), and through the inprocess runner. Cold runs once; warm and
inprocess run ``--repeats`` times, interleaved (warm, inprocess, warm, ...), each on a fresh
copy of the bootstrap, and the ratio kfp.local / inprocess is taken within each pair, so
that both sides of a ratio see the same background load. The toy runs with
``run.iterations=2``, so its iteration 1 skips the validation pass, as 3 iterations in 4 do.
The per-task table is the first warm run's. For each task:

    wall      from kfp.local's "Executing task" to "finished" log lines (ms resolution)
    stage     ``stage_seconds`` its component wrote into the output metadata
    overhead  wall - stage
    imports   a fresh ``python -c "import kfp.dsl.executor_main, components.io, <stage module>"``
              with ``_KFP_RUNTIME=true`` as in a cold task (kfp then skips its client), wall and CPU

    CPU       warm: the task's worker (the ``taskhost: worker`` line of the host's log);
              inprocess: the stage call's process CPU time

and for the whole iteration the wall and CPU seconds (user + system) of all task processes
(with the host: its workers, and the host's own work between its start and its stop, both once
per ``ac2 run``: its start is timed apart) against the inprocess runner's: on a
shared machine CPU time moves far less with the load than wall time does. Before the rounds
the inprocess runner runs the iteration once unmeasured, so that its rounds, like the host's,
do not pay the process's imports. Per-task figures are medians over the rounds.

Writes bench/results/kfp_overhead.md. Not a test: numbers depend on the machine's load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ac2_core.models.store import ModelStore  # noqa: E402
from ac2_core.runner import inprocess  # noqa: E402
from ac2_core.runner.layout import RunLayout  # noqa: E402
from ac2_core.stages.recipe import ITERATION_STAGES as STAGES  # noqa: E402
from pipelines import driver, local  # noqa: E402

TOY = ROOT / "pipelines" / "configs" / "toy.yaml"
LINE = re.compile(r"^(\d\d):(\d\d):(\d\d\.\d+) - INFO - (Executing task|Task) '([\w-]+)'(?: finished with status (\w+))?")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
GOAL_S = 1.5


def load(which: str):
    from ac2_core.config import load_config

    match which:
        case "toy":  # the toy model and task; warm start off: it changes no per-task cost
            overrides = {"warm_start.max_steps": 0, "critic.read_steps": 0, "run.iterations": 2}
            return load_config(TOY, overrides), "toy (" + ", ".join(f"{k}={v}" for k, v in overrides.items()) + ")"
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


WORKER = re.compile(r"^taskhost: worker \d+ ran components\.io:execute_stage \((\w+)\) in [\d.]+s, ([\d.]+)s CPU", re.M)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def kfp_iteration(cfg, boot: dict, root: Path, label: str, *, warm: bool) -> dict:
    """One iteration through kfp.local (its own run folder under ``root``): per-task walls and
    stage seconds, and the iteration's wall and CPU seconds."""
    from pipelines import taskhost
    from pipelines.dag import iteration_pipeline

    host_log = root / "logs" / f"{label}-taskhost.log"
    t0 = time.perf_counter()
    host_start, host_cpu, workers = 0.0, 0.0, {}
    with contextlib.ExitStack() as stack:
        if warm:  # the host starts once per `ac2 run`: its start is timed apart, and its CPU until then left out
            address = stack.enter_context(local.warm_task_host(host_log))
            host_start = time.perf_counter() - t0 + taskhost.wait_ready(address)
            host_cpu = -_own_cpu(address)
        t1, c1 = time.perf_counter(), _children_cpu()
        arguments = driver.pipeline_arguments(cfg, 1, lambda _, name: boot[name])
        run_root = local.run_pipeline(iteration_pipeline, arguments, root, label)
        wall = time.perf_counter() - t1
        cpu = _children_cpu() - c1  # the task processes; the host and its workers are not reaped yet
        if warm:
            host_cpu += _own_cpu(address)  # its work between tasks: loading models, forking
            workers = _worker_cpu(host_log, len(stage_seconds(run_root)))
    return {
        "host_start": host_start,
        "walls": task_walls(root / "logs" / f"{label}.log"),
        "stage": stage_seconds(run_root),
        "task_cpu": workers,
        "wall": wall,
        "cpu": cpu + host_cpu + sum(workers.values()),
        "outputs": driver.find_outputs(str(run_root)),
    }


def _own_cpu(address: str) -> float:
    """CPU seconds (user + system) of the task host serving at ``address``, not its workers'."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if address.encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    raise RuntimeError(f"no task host serves at {address}")


def _worker_cpu(host_log: Path, tasks: int) -> dict[str, float]:
    """Each task's worker CPU seconds, from the host's log, once all ``tasks`` workers have written
    their line (a worker writes it after its reply, so the last may come after the run ends)."""
    deadline = time.monotonic() + 30
    while len(found := WORKER.findall(host_log.read_text())) < tasks and time.monotonic() < deadline:
        time.sleep(0.05)
    return {name.replace("_", "-"): float(c) for name, c in found}


def inprocess_iteration(cfg, boot: dict, folder: Path) -> dict:
    """The same iteration through the inprocess runner (``inprocess.run_iteration``), on a copy of the
    bootstrap in ``folder``: each stage's wall and CPU seconds, the iteration's, and its layout."""
    layout = RunLayout(str(folder))
    for name, uri in boot.items():
        Path(layout.bootstrap(name)).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-r", uri, layout.bootstrap(name)], check=True)
    t0, c0 = time.perf_counter(), time.process_time()
    done = inprocess.run_iteration(cfg, layout, 1, ModelStore(cfg, keep_in_memory=True))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"stage": done.seconds, "stage_cpu": done.cpu_seconds, "wall": wall, "cpu": cpu, "layout": layout}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="toy", help="toy (default) or tiny")
    p.add_argument("--out", help="work folder (default: a temporary one)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved warm kfp.local and inprocess runs (default 3)")
    args = p.parse_args()
    cfg, described = load(args.config)
    work = Path(args.out or tempfile.mkdtemp(prefix="ac2-kfp-overhead-")).resolve()
    root = work / "kfp"
    print(f"config: {described}; work folder {work}", flush=True)

    from ac2_core import storage
    from pipelines.dag import bootstrap_pipeline

    local._init(root)
    t0 = time.perf_counter()
    boot = driver.find_outputs(str(local.run_pipeline(bootstrap_pipeline, {"config_json": cfg.to_json()}, root, "bootstrap")))
    print(f"bootstrap (not measured): {time.perf_counter() - t0:.1f}s", flush=True)

    load_start = os.getloadavg()[0]
    cold = kfp_iteration(cfg, boot, root, "iter-0001-cold", warm=False)
    print(f"kfp.local, cold tasks: {cold['wall']:.1f}s (load {load_start:.2f})", flush=True)
    t0 = time.perf_counter()
    inprocess_iteration(cfg, boot, work / "inprocess-warmup")  # the process's imports, as the host's start
    print(f"inprocess warm-up (not measured): {time.perf_counter() - t0:.1f}s", flush=True)
    rounds = []  # (warm kfp.local run, inprocess run, (load before each), outputs identical)
    for n in range(args.repeats):
        load_w = os.getloadavg()[0]
        w = kfp_iteration(cfg, boot, root, f"iter-0001-warm-{n}", warm=True)
        load_i = os.getloadavg()[0]
        ip = inprocess_iteration(cfg, boot, work / f"inprocess-{n}")
        layout = ip["layout"]
        same_ip = all(storage.content_hash(w["outputs"][k]) == storage.content_hash(layout.output(1, k)) for k in w["outputs"])
        rounds.append((w, ip, (load_w, load_i), same_ip))
        print(
            f"round {n + 1}: kfp.local warm {w['wall']:.1f}s, {w['cpu']:.1f}s CPU (load {load_w:.2f}), inprocess"
            f" {ip['wall']:.1f}s, {ip['cpu']:.1f}s CPU (load {load_i:.2f}): {w['wall'] / ip['wall']:.2f}x wall,"
            f" {w['cpu'] / ip['cpu']:.2f}x CPU",
            flush=True,
        )
    hashes = lambda run: {k: storage.content_hash(uri) for k, uri in run["outputs"].items()}  # noqa: E731
    same = all(hashes(w) == hashes(cold) and same_ip for w, _, _, same_ip in rounds)
    load_end = os.getloadavg()[0]
    med = statistics.median
    warm = {  # per task, the median over the rounds
        key: {t: med(w[key].get(t, 0.0) for w, *_ in rounds) for t in rounds[0][0][key]} for key in ("walls", "stage", "task_cpu")
    }
    warm |= {k: med(w[k] for w, *_ in rounds) for k in ("wall", "cpu", "host_start")}
    inproc = {key: {t: med(ip[key][t] for _, ip, *_ in rounds) for t in rounds[0][1][key]} for key in ("stage", "stage_cpu")}
    inprocess_wall, inprocess_cpu = med(ip["wall"] for _, ip, *_ in rounds), med(ip["cpu"] for _, ip, *_ in rounds)

    python_start = _timed([sys.executable, "-c", "pass"])
    kfp_start = _timed([sys.executable, "-c", "import kfp.dsl.executor_main, components.io"])
    rows = []
    for task in ["config", *[s.replace("_", "-") for s in STAGES]]:
        if task not in cold["walls"]:
            continue
        name = task.replace("-", "_")
        module = "ac2_core.config" if name == "config" else f"ac2_core.stages.{name}"
        rows.append((name, cold, warm, import_seconds(module), inproc["stage"].get(name), inproc["stage_cpu"].get(name)))
    n = len(rows)

    def overheads(run: dict) -> list[float]:
        return [run["walls"][t] - run["stage"].get(t, 0.0) for t in (name.replace("_", "-") for name, *_ in rows)]

    lines = [
        "# kfp.local per-task overhead",
        "",
        f"Config: {described}. Machine: {os.cpu_count()} CPUs, load average {load_start:.2f} before the kfp.local"
        f" iterations, {load_end:.2f} after the last inprocess one (each round's below): wall times, and their"
        " ratios, were measured under that load.",
        f"Reproduce: `nice -n 10 .venv/bin/python bench/kfp_overhead.py --config {args.config} --repeats {args.repeats}`",
        "",
        "cold = every task a fresh process that imports the stage code (as on a cluster);"
        " warm = the tasks hand their stage calls to the warm task host (`pipelines.taskhost`, the default of"
        " `ac2 run`). overhead = task wall time (kfp.local log) - time inside the stage function"
        " (`stage_seconds` metadata). imports = a fresh interpreter importing kfp's executor, components.io and the"
        f" stage module, as a cold task does; wall and CPU, best of 3 (bare `python -c pass`: {python_start[0]:.2f}s"
        f" wall; with kfp's executor and components.io: {kfp_start[0]:.2f}s wall, {kfp_start[1]:.2f}s CPU)."
        " A cold task imports more at run time (transformers' model code where a model is loaded), inside its stage"
        " seconds. warm CPU = the task's worker, from its line in the host's log; inprocess CPU = the stage call's."
        f" warm and inprocess: medians over the {args.repeats} rounds.",
        "",
        "| task | cold: wall s | stage s | overhead s | imports s (CPU s) | warm: wall s | stage s | overhead s"
        " | CPU s | inprocess: stage s | CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, c, w, (imp, imp_cpu), ip, ip_cpu in rows:
        t = name.replace("_", "-")
        ip_s = "" if ip is None else f"{ip:.2f} | {ip_cpu:.2f}"
        w_cpu = f"{w['task_cpu'][t]:.2f}" if t in w["task_cpu"] else ""
        c_stage, w_stage = c["stage"].get(t, 0.0), w["stage"].get(t, 0.0)
        lines.append(
            f"| {name} | {c['walls'][t]:.2f} | {c_stage:.2f} | {c['walls'][t] - c_stage:.2f} | {imp:.2f} ({imp_cpu:.2f})"
            f" | {w['walls'][t]:.2f} | {w_stage:.2f} | {w['walls'][t] - w_stage:.2f} | {w_cpu} | {ip_s or ' |'} |"
        )
    lines.append("")
    for label, run in (("cold", cold), ("warm", warm)):
        o = overheads(run)
        lines += [
            f"- **{label}**: mean overhead {sum(o) / n:.2f}s per task (goal < {GOAL_S}s), max {max(o):.2f}s;"
            f" {sum(o):.1f}s of the {run['wall']:.1f}s iteration ({sum(o) / run['wall']:.0%});"
            f" against the inprocess iteration, {(run['wall'] - inprocess_wall) / n:.2f}s wall and"
            f" {(run['cpu'] - inprocess_cpu) / n:.2f}s CPU more per task (iteration CPU {run['cpu']:.1f}s)",
        ]
    lines += [
        f"- the warm host's start, once per `ac2 run`: {warm['host_start']:.1f}s until its imports were done"
        " (tasks that arrive earlier queue; its CPU, and its stop's, are left out of the warm iteration's)",
        f"- inprocess: {inprocess_wall:.1f}s wall, {inprocess_cpu:.1f}s CPU"
        f" (kfp.local / inprocess: cold {cold['wall'] / inprocess_wall:.1f}x, warm {warm['wall'] / inprocess_wall:.1f}x)",
        f"- cold, warm and inprocess outputs identical (content hashes, every run): {'yes' if same else 'NO'}",
        "",
        "Interleaved rounds (warm kfp.local, then inprocess, each a fresh copy of the bootstrap; CPU: user + system"
        " of every process of the iteration):",
        "",
        "| round | kfp.local warm s (load) | inprocess s (load) | wall ratio | warm CPU s | inprocess CPU s | CPU ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {n + 1} | {w['wall']:.1f} ({lw:.2f}) | {ip['wall']:.1f} ({li:.2f}) | {w['wall'] / ip['wall']:.2f}x"
            f" | {w['cpu']:.1f} | {ip['cpu']:.1f} | {w['cpu'] / ip['cpu']:.2f}x |"
            for n, (w, ip, (lw, li), _) in enumerate(rounds)
        ),
        "",
        f"**Median of the per-round ratios: {med(w['wall'] / ip['wall'] for w, ip, *_ in rounds):.2f}x wall,"
        f" {med(w['cpu'] / ip['cpu'] for w, ip, *_ in rounds):.2f}x CPU** (goal ≤ 1.2x).",
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
