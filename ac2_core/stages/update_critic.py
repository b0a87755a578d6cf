"""update_critic: fit V to outcomes with BCE (docs/design.md section 2, step 6).

Inputs are the states of this iteration's finished trajectories at chunk boundaries
(the ``critic_pairs`` already scored out of sample), with the problem and reference
solution in front. With ``critic.td_weight > 0`` the start state of each unfinished chunk
is also fitted to the bootstrapped V(s+c).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ac2_core.config import AC2Config
from ac2_core.math import critic_bce_loss
from ac2_core.models.device import device_of
from ac2_core.models.store import ModelStore
from ac2_core.stages.common import Problems, StageStats, read, rng_for
from ac2_core.stages.critic_io import CriticInputs

STAGE = "update_critic"


def training_examples(cfg: AC2Config, builder: CriticInputs, pairs: list[dict], scored: list[dict]) -> list[tuple]:
    """(critic input, target, weight) for every distinct input: pairs, plus TD examples when enabled.

    The G samples of a group share their early states, so many pairs have the same input.
    They are merged into one example with the weighted mean target and the summed weight:
    ``sum_i w_i BCE(x, y_i)`` and ``W BCE(x, sum_i w_i y_i / W)`` have the same gradient.
    """
    response = {s["chunk_id"]: s["response_token_ids"] for s in scored}
    examples = []
    for p in pairs:
        state = response[p["trajectory_id"]][: p["cut"]]
        examples.append((builder.build(p["problem_id"], p["ref_trajectory_id"], state), p["outcome"], 1.0))
    if cfg.critic.td_weight > 0:
        L = cfg.rollout.chunk_tokens
        for s in scored:
            if not s["finished"]:
                # an unfinished chunk starts at the last chunk boundary before its end
                start = s["response_token_ids"][: (len(s["response_token_ids"]) - 1) // L * L]
                x = builder.build(s["problem_id"], s["ref_trajectory_id"], start)
                examples.append((x, s["value_end"], cfg.critic.td_weight))
    merged: dict[tuple, list[float]] = {}
    for x, y, w in examples:
        acc = merged.setdefault(tuple(x), [0.0, 0.0])
        acc[0] += w * y
        acc[1] += w
    return [(list(x), wy / w, w) for x, (wy, w) in merged.items()]


@dataclass(frozen=True)
class CriticStats(StageStats):
    examples: int
    critic_tokens: int  # of the distinct inputs, before the per-step draw
    loss_first: float
    loss_last: float
    critic_version: int
    critic_hash: str


def run(
    cfg: AC2Config,
    *,
    iteration: int,
    problems: str,
    replay: str,
    critic: str,
    critic_pairs: str,
    scored_chunks: str,
    out_critic: str,
    store: ModelStore | None = None,
) -> CriticStats:
    store = store or ModelStore(cfg)
    ckpt = store.take(critic, kind="critic")
    ckpt.trained_tokens = 0
    builder = CriticInputs(cfg, ckpt.tokenizer, Problems.load(problems), read(replay, "replay"))
    examples = training_examples(cfg, builder, read(critic_pairs, "critic_pairs"), read(scored_chunks, "scored_chunks"))
    pad = ckpt.tokenizer.pad_token_id
    rng = rng_for(cfg, iteration, STAGE)

    def loss_fn(model, part):
        mb, total_weight = part
        device = device_of(model)
        width = max(len(x) for x, _, _ in mb)
        ids = torch.full((len(mb), width), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, (x, _, _) in enumerate(mb):
            ids[i, : len(x)] = torch.tensor(x)
            attn[i, : len(x)] = 1
        logits = model(ids.to(device), attn.to(device))
        targets = torch.tensor([t for _, t, _ in mb], dtype=torch.float32, device=device)
        weights = torch.tensor([w for _, _, w in mb], dtype=torch.float32, device=device)
        share = float(weights.sum()) / total_weight  # micro-batch losses sum to the step's weighted mean
        return critic_bce_loss(logits, targets, weights) * share, {}

    trainer = store.trainer(ckpt)
    history = []
    for _ in range(cfg.critic.steps_per_iteration if examples else 0):
        # each step fits a seeded draw of at most batch_size examples
        pick = sorted(rng.choice(len(examples), size=min(cfg.critic.batch_size, len(examples)), replace=False))
        batch = [examples[i] for i in pick]
        total_weight = sum(w for _, _, w in batch)
        mb = cfg.critic.micro_batch_size
        history.append(trainer.step([(batch[i : i + mb], total_weight) for i in range(0, len(batch), mb)], loss_fn))
        ckpt.trained_tokens += sum(len(x) for x, _, _ in batch)
    ckpt.version += 1
    critic_hash = store.save(out_critic, ckpt, stage=STAGE)
    return CriticStats(
        examples=len(examples),
        critic_tokens=sum(len(x) for x, _, _ in examples),
        loss_first=history[0]["loss"] if history else 0.0,
        loss_last=history[-1]["loss"] if history else 0.0,
        critic_version=ckpt.version,
        critic_hash=critic_hash,
    )
