"""update_actor and update_critic of the toy in 1 and 2 CPU processes: stage seconds and weight gaps.

From a finished toy run (``--run``, the inprocess layout, iteration 2 kept), advantages
are recomputed with the critic baseline so that every chunk trains (a barely warm-started
toy policy earns reward 0, and leave-one-out advantages would all be 0). Then each update
stage runs from the same artifacts:

- in the stage's own process (1 process, as by default on CPU);
- in 1 process started by torchrun (``training.launch: always``): the launch's own cost;
- in 2 processes under torchrun (``training.num_processes: 2``).

Seconds are the stage's wall time, loading and saving the checkpoint included; the
launched rows include starting the processes (torchrun, imports). Run it with
``OMP_NUM_THREADS=1`` so that every process has one thread, as torchrun gives each of
several. Reproduce:

    .venv/bin/ac2 run --config pipelines/configs/toy.yaml --out /tmp/toy2 --runner inprocess --iterations 2 \\
        --set warm_start.max_steps=50
    OMP_NUM_THREADS=1 .venv/bin/python -m bench.data_parallel --run /tmp/toy2
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from ac2_core.config import load_config
from ac2_core.models.store import ModelStore
from ac2_core.runner import inprocess
from ac2_core.runner.layout import RunLayout
from ac2_core.stages.recipe import run_stage
from bench._common import publish

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "pipelines" / "configs" / "toy.yaml"
SETTINGS = {
    "1 process, the stage's own": {},
    "1 process under torchrun": {"training.launch": "always"},
    "2 processes under torchrun": {"training.num_processes": 2},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True, help="a toy run folder (inprocess layout) with iteration 2")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each setting (default 2; the report keeps the fastest)")
    args = parser.parse_args()
    base = {"warm_start.max_steps": 50, "run.iterations": 2, "advantage.baseline": "critic"}
    layout = RunLayout(args.run)
    work = Path(tempfile.mkdtemp(prefix="ac2-bench-dp-"))
    advantages = str(work / "advantages")
    calls = {call.stage: call.kwargs for call in inprocess.stage_calls(load_config(TOY, base), layout, 2)}
    _advantages(base, calls["check_readiness"], work)
    rows, outs = [], {}
    for label, over in SETTINGS.items():
        cfg = load_config(TOY, base | over)
        best, result = {}, {}
        for k in range(args.repeats):
            out = work / f"{len(outs)}-{k}"
            for call in inprocess.stage_calls(cfg, layout, 2):
                if call.stage.startswith("update_"):
                    kwargs = {key: (str(out / key) if key.startswith("out_") else v) for key, v in call.kwargs.items()}
                    if "advantages" in kwargs:
                        kwargs["advantages"] = advantages
                    t0 = time.perf_counter()
                    result[call.stage] = dataclasses.replace(call, kwargs=kwargs).run(cfg)
                    best[call.stage] = min(best.get(call.stage, float("inf")), time.perf_counter() - t0)
        outs[label] = out
        rows.append((label, best, result, os.getloadavg()[0]))
    first = outs[next(iter(SETTINGS))]
    gaps = {label: {kind: _gap(first, o, kind) for kind in ("actor", "critic")} for label, o in outs.items()}
    publish(_report(rows, gaps, args), ROOT / "bench" / "results" / "data_parallel.md")
    return 0


def _advantages(base: dict, kwargs: dict, work: Path) -> None:
    cfg = load_config(TOY, base)
    outputs = {"out_readiness": str(work / "readiness"), "out_advantages": str(work / "advantages")}
    run_stage(cfg, "check_readiness", iteration=2, kwargs=kwargs | outputs)


def _gap(a: Path, b: Path, kind: str) -> float:
    store = ModelStore(load_config(TOY))
    x, y = (store.load(str(o / f"out_{kind}"), kind=kind).model for o in (a, b))
    return max(float((p - q).detach().abs().max()) for p, q in zip(x.parameters(), y.parameters()))


def _report(rows, gaps, args) -> str:
    lines = [
        "# Data-parallel updates on the toy: 1 and 2 CPU processes",
        "",
        f"{time.strftime('%d %b %Y')}, {os.cpu_count()} cores ({platform.machine()}), torch {torch.__version__};"
        f" the fastest of {args.repeats} runs of each. Iteration 2 of a toy run, advantages against the critic baseline.",
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')} (torchrun sets 1 for each of several processes"
        " when unset; on a busy machine OpenMP threads that spin for a core slow one process down).",
        "",
        "| setting | update_actor s | update_critic s | trained chunks | actor loss | critic loss (last) | load average |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, best, result, load in rows:
        a, c = result["update_actor"], result["update_critic"]
        lines.append(
            f"| {label} | {best['update_actor']:.1f} | {best['update_critic']:.1f} | {a.trained_chunks} | {a.loss:.6f}"
            f" | {c.loss_last:.6f} | {load:.1f} |"
        )
    lines += ["", "Largest weight gap to the stage's own process:", ""]
    for label, g in gaps.items():
        lines.append(f"- {label}: actor {g['actor']:.2g}, critic {g['critic']:.2g}")
    lines += ["", "Reproduce: `OMP_NUM_THREADS=1 .venv/bin/python -m bench.data_parallel --run RUN_DIR`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
