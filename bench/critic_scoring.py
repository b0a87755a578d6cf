"""Critic scoring: ac2's batched forward against a vLLM pooling engine, on the same critic
and the same inputs.

    nice -n 5 .venv/bin/python bench/critic_scoring.py [--sizes toy,medium] [--inputs 1024] [--threads 1]

The critic is the actor's backbone plus a scalar head on the last token (``V =
sigmoid(head(h_last))``). vLLM serves one model per engine, and the actor's generation
engine is a causal LM, so "scoring through the same engine" means a second engine: the
critic's backbone under vLLM's pooling runner (``convert="embed"``, last-token pooling,
no normalisation), whose output is ``h_last``; the head runs in torch on top. For each
model size:

    hf        ``ac2_core.generation.scoring.score_inputs`` (length-sorted padded batches,
              ``critic.score_batch_size`` rows), the path ``score_chunks`` takes
    vllm      ``ac2_core.generation.vllm.score`` on the same token ids (``critic.scoring_backend:
              vllm``): ``LLM.embed``, then the head

Both score the same random inputs (lengths uniform in [32, ``critic.max_input_tokens``],
as the toy's critic inputs run), interleaved, best of ``--repeats``. The engine's start is
timed apart. The values must agree (max |dV| is reported): otherwise the comparison is void.

Writes bench/results/critic_scoring.md. Not a test: numbers depend on the machine's load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import publish, set_threads  # noqa: E402

TOY = ROOT / "pipelines" / "configs" / "toy.yaml"
SIZES = {  # TinyModelConfig overrides; "toy" is the toy config's own model
    "toy": {},
    "medium": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 4, "head_dim": 64, "intermediate_size": 1536},
}


def build_critic(cfg, size: str, folder: Path):
    """A seeded critic of ``size`` with a random head (a zero head scores 0.5 everywhere),
    saved to ``folder``; returns (critic, tokenizer)."""
    import torch

    from ac2_core.models.critic import Critic
    from ac2_core.models.tiny import build_tiny_model
    from ac2_core.models.tokenizer import build_tokenizer
    from ac2_core.tasks import problems_for

    tiny = cfg.model.tiny.model_copy(update=SIZES[size])
    tok = build_tokenizer(r["prompt"] + (r["solution"] or "") for r in problems_for(cfg.task).to_pylist())
    critic = Critic.from_actor(build_tiny_model(tok, tiny, seed=cfg.seed), seed=cfg.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        torch.nn.init.normal_(critic.value_head.weight, std=1.0 / tiny.hidden_size**0.5)
    critic.save(folder, tok)
    return critic.eval(), tok


def random_inputs(n: int, longest: int, vocab: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(4, vocab) for _ in range(rng.randint(32, longest))] for _ in range(n)]


def measure(cfg, size: str, n: int, repeats: int, work: Path) -> dict:
    from ac2_core.generation import vllm as vllm_backend
    from ac2_core.generation.scoring import score_inputs

    folder = work / f"critic-{size}"
    critic, tok = build_critic(cfg, size, folder)
    longest = cfg.critic.max_input_tokens
    inputs = random_inputs(n, longest, len(tok), cfg.seed)
    tokens = sum(map(len, inputs))
    # on CPU: eager, 1 GiB of KV cache, and at most half the RAM (vLLM checks it at start)
    settings = vllm_backend.EngineSettings(
        enforce_eager=True, kv_cache_gib=1.0, gpu_memory_utilization=0.5, max_model_len=longest
    )
    t0 = time.perf_counter()
    vllm_backend.engine(folder, settings, role="score")
    engine_start = time.perf_counter() - t0
    hf_times, vllm_times = [], []
    for _ in range(repeats):  # interleaved, so load falls on both alike
        t0 = time.perf_counter()
        hf = score_inputs(critic, inputs, pad_id=tok.pad_token_id, batch_size=cfg.critic.score_batch_size)
        hf_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        vl = vllm_backend.score(folder, critic.value_head, inputs, settings=settings)
        vllm_times.append(time.perf_counter() - t0)
    vllm_backend.release()
    return {
        "size": size,
        "params": sum(p.numel() for p in critic.backbone.parameters()),
        "inputs": n,
        "tokens": tokens,
        "hf_s": min(hf_times),
        "vllm_s": min(vllm_times),
        "engine_start": engine_start,
        "max_dv": max(abs(a - b) for a, b in zip(hf, vl)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="toy,medium", help=f"comma-separated, from {', '.join(SIZES)}")
    p.add_argument("--inputs", type=int, default=1024, help="critic inputs scored per repeat (default 1024)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch threads for both sides (default: torch's own)")
    p.add_argument("--out", help="work folder (default: a temporary one)")
    args = p.parse_args()
    sizes = args.sizes.split(",")
    if unknown := set(sizes) - set(SIZES):
        raise SystemExit(f"--sizes: unknown {', '.join(sorted(unknown))}; choose from {', '.join(SIZES)}")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # as the tests: no pinning on a shared machine
    if args.threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    set_threads(args.threads)

    from ac2_core.config import load_config

    cfg = load_config(TOY)
    work = Path(args.out or tempfile.mkdtemp(prefix="ac2-critic-scoring-")).resolve()
    load_start = os.getloadavg()[0]
    results = []
    for size in sizes:
        results.append(measure(cfg, size, args.inputs, args.repeats, work))
        print(results[-1], flush=True)

    threads = f", {args.threads} thread(s)" if args.threads else ""
    lines = [
        "# Critic scoring: batched forward (hf) against a vLLM pooling engine",
        "",
        f"Machine: {os.cpu_count()} CPUs{threads}, load average {load_start:.2f} at the start and"
        f" {os.getloadavg()[0]:.2f} at the end; vLLM {_vllm_version()} (CPU, eager, float32, chunked prefill off).",
        f"Reproduce: `nice -n 5 .venv/bin/python bench/critic_scoring.py --sizes {args.sizes} --inputs {args.inputs}"
        f" --repeats {args.repeats}{f' --threads {args.threads}' if args.threads else ''}`",
        "",
        f"Inputs: {args.inputs} random token sequences, lengths uniform in [32, {cfg.critic.max_input_tokens}]"
        f" (the toy's `critic.max_input_tokens`); hf batches of {cfg.critic.score_batch_size} rows"
        " (`critic.score_batch_size`). Best of the repeats, interleaved.",
        "",
        "| model | backbone params | input tokens | hf tokens/s | vllm tokens/s | vllm / hf | vllm engine start s | max abs dV |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['size']} | {r['params'] / 1e6:.1f}M | {r['tokens']} | {r['tokens'] / r['hf_s']:,.0f}"
            f" | {r['tokens'] / r['vllm_s']:,.0f} | {r['hf_s'] / r['vllm_s']:.2f}x | {r['engine_start']:.1f}"
            f" | {r['max_dv']:.1e} |"
        )
    publish("\n".join(lines) + "\n", ROOT / "bench" / "results" / "critic_scoring.md")


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


if __name__ == "__main__":
    main()
