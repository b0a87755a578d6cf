"""One AC2 iteration through the real stages on a device, measured (issue 5's GPU check).

On a GPU machine: ``python -m tests.gpu.iteration`` (or ``pytest -s tests/gpu``). It
bootstraps a random Qwen3-architecture model (hidden 1024, 8 layers, no warm start)
once, then runs iteration 1 (``inprocess.run_iteration``: every stage, ``hf`` generation)
from that bootstrap once per training backend: ``torch``, and ``deepspeed`` when it is
importable. It prints, and writes to ``$OUT/gpu_iteration.md`` when ``OUT`` is set:

- generate_chunks decode tokens/s (its decoded tokens over its seconds);
- the step times: the seconds of update_actor and update_critic (one iteration's
  optimizer steps, saving the checkpoint included; for deepspeed, its engine's setup too);
- every other stage's seconds, and what the updates trained on.

``tests/stages/test_device.py`` runs the same functions on the CPU with a tiny model,
so this path is exercised in CI; ``tests/gpu/test_gpu_iteration.py`` runs it on CUDA.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from ac2_core.config import AC2Config, load_config
from ac2_core.models.device import device_of
from ac2_core.models.store import ModelStore
from ac2_core.runner import inprocess, loop
from ac2_core.runner.layout import RunLayout
from ac2_core.stages.recipe import ITERATION_STAGES

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "pipelines" / "configs" / "toy.yaml"

# A Qwen3-0.6B-wide model, 8 blocks deep (about 100M non-embedding parameters).
GPU_MODEL = {
    "hidden_size": 1024,
    "num_layers": 8,
    "num_heads": 16,
    "num_kv_heads": 8,
    "head_dim": 64,
    "intermediate_size": 3072,
    "max_position_embeddings": 1024,
}
GPU_RUN = {
    "model.device": "cuda",
    "model.dtype": "bfloat16",
    "model.tiny": GPU_MODEL,
    "warm_start.max_steps": 0,
    "task.train_size": 1024,
    "task.val_size": 64,
    "rollout.problems_per_iteration": 64,
    "rollout.group_size": 8,
    "eval.samples_per_problem": 1,
    "run.iterations": 1,
    # A random model earns reward 0 everywhere, so the default leave-one-out advantages are
    # all 0 and update_actor would train nothing. Against the critic's start value
    # (0.5 from its zero head) every chunk gets A = -0.5, and the actor takes a real step;
    # full-mode groups too, so they keep the critic's advantage instead of GRPO's.
    "advantage.baseline": "critic",
    "advantage.full_groups": "chunk",
}
STAGES = ITERATION_STAGES


def backends() -> list[str]:
    """The training backends this machine can run."""
    return ["torch"] + (["deepspeed"] if importlib.util.find_spec("deepspeed") else [])


def measure(base: dict, out_dir: Path, training_backends: list[str]) -> list[dict]:
    """Bootstrap once under ``out_dir``, then run iteration 1 with each training backend.

    ``base``: config overrides on top of toy.yaml (dotted keys). Returns one row per
    backend: its stage metrics, stage seconds, and the device and dtype its models ended on.
    """
    first = load_config(TOY, {**base, "training.backend": training_backends[0]})
    boot = out_dir / "bootstrap-run"
    t0 = time.perf_counter()
    inprocess.run_bootstrap(first, RunLayout(str(boot)), log=lambda _: None)
    bootstrap_seconds = time.perf_counter() - t0
    rows = []
    for backend in training_backends:
        cfg = load_config(TOY, {**base, "training.backend": backend})
        rows.append(_one_iteration(cfg, out_dir / backend, boot) | {"bootstrap_seconds": bootstrap_seconds})
    return rows


def _one_iteration(cfg: AC2Config, run_root: Path, bootstrap_root: Path) -> dict:
    layout = RunLayout(str(run_root))
    loop.adopt_bootstrap(cfg, layout, str(bootstrap_root))
    store = ModelStore(cfg, keep_in_memory=True)
    # loaded (and moved to the device) before the clock starts: the stages' seconds are their work
    store.load(layout.bootstrap("actor"), kind="actor")
    store.load(layout.bootstrap("critic"), kind="critic")
    _synchronize(store.device)
    done = inprocess.run_iteration(cfg, layout, 1, store)
    actor = store.load(layout.output(1, "actor"), kind="actor").model  # from memory: the trained model itself
    critic = store.load(layout.output(1, "critic"), kind="critic").model
    seconds = done.seconds
    results = {stage: s.as_dict() for stage, s in done.stats.items()}
    gen = results["generate_chunks"]
    return {
        "backend": cfg.training.backend + (f" (ZeRO-{cfg.training.zero_stage})" if cfg.training.backend == "deepspeed" else ""),
        "devices": {
            "actor": str(device_of(actor)),
            "critic": str(device_of(critic)),
            "critic head": str(device_of(critic.value_head)),
        },
        "dtypes": {"actor": str(next(actor.parameters()).dtype), "critic head": str(critic.value_head.weight.dtype)},
        "decode_tokens": gen["decode_tokens"],
        "tokens_per_second": gen["decode_tokens"] / seconds["generate_chunks"],
        "seconds": seconds,
        "metrics": results,
    }


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def report(rows: list[dict], *, title: str) -> str:
    """The rows as markdown: one table of rates and step times, one of every stage's seconds."""
    lines = [f"# {title}", "", f"torch {torch.__version__}; {_device_name()}", ""]
    head = ("training backend", "decode tokens", "tokens/s", "update_actor s", "update_critic s", "trained chunks", "actor loss")
    lines += ["| " + " | ".join(head) + " | critic loss (last) |"]
    lines += ["|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        a, c = r["metrics"]["update_actor"], r["metrics"]["update_critic"]
        lines.append(
            f"| {r['backend']} | {r['decode_tokens']} | {r['tokens_per_second']:,.0f} | {r['seconds']['update_actor']:.2f}"
            f" | {r['seconds']['update_critic']:.2f} | {a['trained_chunks']} | {a['loss']:.4f} | {c['loss_last']:.4f} |"
        )
    lines += ["", "Seconds per stage (the bootstrap, shared: " + f"{rows[0]['bootstrap_seconds']:.1f} s):", ""]
    lines += ["| training backend | " + " | ".join(STAGES) + " |", "|---|" + "---:|" * len(STAGES)]
    for r in rows:
        lines.append(f"| {r['backend']} | " + " | ".join(f"{r['seconds'][s]:.2f}" for s in STAGES) + " |")
    lines += ["", "Models after the iteration:", ""]
    for r in rows:
        lines.append(f"- {r['backend']}: devices {r['devices']}, dtypes {r['dtypes']}")
    return "\n".join(lines) + "\n"


def _device_name() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"


def write_report(text: str, name: str = "gpu_iteration.md") -> Path | None:
    """Print ``text``; also write it to ``$OUT/name`` when OUT is set (the device machine's output folder)."""
    print(text)
    out = os.environ.get("OUT")
    if not out:
        return None
    path = Path(out) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured", file=sys.stderr)
        return 1
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "ac2-gpu-iteration"
    shutil.rmtree(work, ignore_errors=True)
    rows = measure(GPU_RUN, work, backends())
    write_report(report(rows, title="One AC2 iteration on CUDA (hidden 1024, 8 layers, bf16, hf generation)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
