"""What the warm start leaves for RL: the SFT policy's score and slip rate against steps.

    .venv/bin/python bench/warm_start.py --settings 8:0 8:0.06 10:0.06 --steps 2000 --every 250

Each setting is ``n_terms:slip_rate``. For each, the toy config's tiny model is built and
warm-started exactly as the bootstrap does it (``sft_warm_start`` on the task's training
problems, with ``warm_start.slip_rate`` slipped demonstrations), for ``--steps`` steps with
the config's cosine schedule; every ``--every`` steps it reports, on ``--problems``
validation problems: the sampled score at the rollout temperature (what RL starts from),
the greedy score, and the share of written steps whose sum is wrong. Not a test; one torch
thread; runs on ``--device``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEP = re.compile(r"(\d+)\+(\d+)=(\d+)")


def step_errors(text: str) -> tuple[int, int]:
    """(wrong sums, written steps) of one answer."""
    steps = text.split("#")[0].split(";")[:-1]
    wrong = sum(not (m := STEP.fullmatch(s)) or int(m[1]) + int(m[2]) != int(m[3]) for s in steps)
    return wrong, len(steps)


def probe(cfg, *, steps: int, every: int, n_problems: int, device: str, log) -> None:
    import numpy as np

    from ac2_core.generation import generate
    from ac2_core.models.tiny import build_tiny_model
    from ac2_core.models.tokenizer import build_tokenizer
    from ac2_core.stages.common import prompt_ids
    from ac2_core.tasks import arith, problems_for
    from ac2_core.training.sft import sft_warm_start

    rows = problems_for(cfg.task).to_pylist()
    tok = build_tokenizer(r["prompt"] + r["solution"] for r in rows)
    model = build_tiny_model(tok, cfg.model.tiny, seed=cfg.seed).to(device)
    train = [r for r in rows if r["split"] == "train"]
    val = [r for r in rows if r["split"] == "val"][:n_problems]
    rng = np.random.default_rng([cfg.seed, cfg.task.seed])
    ws = cfg.warm_start
    demos = [arith.slipped_solution(arith.terms_of(r["prompt"]), slip_rate=ws.slip_rate, rng=rng) for r in train]
    contexts = [prompt_ids(tok, r["prompt"]) for r in val]
    budget = cfg.rollout.max_response_tokens
    t0 = time.perf_counter()

    def evaluate(m) -> float:
        kw = dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, seed=5, temperature=cfg.rollout.temperature)
        sampled = generate(m, contexts, [budget] * len(contexts), n=2, **kw)
        greedy = generate(m, contexts, [budget] * len(contexts), n=1, greedy=True, **kw)
        score = wrong = written = 0
        for r, group in zip(val, sampled):
            for s in group:
                text = tok.decode(s.token_ids, skip_special_tokens=True)
                score += arith.grade(r["answer"], text)
                w, n = step_errors(text)
                wrong, written = wrong + w, written + n
        greedy_score = sum(
            arith.grade(r["answer"], tok.decode(g[0].token_ids, skip_special_tokens=True)) for r, g in zip(val, greedy)
        )
        record = {
            "sampled": score / (2 * len(val)),
            "greedy": greedy_score / len(val),
            "step_error": wrong / max(written, 1),
            "wall_s": time.perf_counter() - t0,
        }
        log(record)
        return record["sampled"]

    sft_warm_start(
        model,
        tok,
        [r["prompt"] for r in train],
        demos,
        steps=steps,
        batch_size=ws.batch_size,
        lr=ws.lr,
        seed=cfg.seed,
        eval_fn=evaluate,
        eval_every=every,
        target_score=None,
        min_lr_ratio=ws.min_lr_ratio,
        log=lambda _: None,
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "pipelines" / "configs" / "toy.yaml"))
    p.add_argument("--settings", nargs="+", default=["8:0", "8:0.06"], help="n_terms:slip_rate")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--problems", type=int, default=256, help="validation problems scored (2 samples each, and greedy)")
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--records", default=str(ROOT / "bench" / "runs" / "warm_start" / "records.jsonl"))
    args = p.parse_args(argv)

    import torch

    from ac2_core.config import load_config

    torch.set_num_threads(1)
    out = Path(args.records)
    out.parent.mkdir(parents=True, exist_ok=True)
    for setting in args.settings:
        n_terms, slip = setting.split(":")
        cfg = load_config(
            args.config,
            {
                "task.n_terms": int(n_terms),
                "warm_start.slip_rate": float(slip),
                "warm_start.min_lr_ratio": args.min_lr_ratio,
                "rollout.max_response_tokens": 12 * int(n_terms) + 8,
            },
        )
        step = [0]

        def log(record, setting=setting, step=step):
            step[0] += args.every
            row = {
                "setting": setting,
                "step": min(step[0], args.steps),
                "device": args.device,
                "load": os.getloadavg()[0],
                **record,
            }
            print(json.dumps(row), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")

        probe(cfg, steps=args.steps, every=args.every, n_problems=args.problems, device=args.device, log=log)


if __name__ == "__main__":
    main()
