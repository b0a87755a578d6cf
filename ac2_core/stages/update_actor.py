"""update_actor: PPO-clip policy gradient on chunk tokens (docs/design.md section 2, step 5).

The context is prompt + prefix; only the chunk's own tokens carry loss, each with its row's
advantage, or its own where the row carries ``token_advantages`` (the critic's credit along
a whole answer, ``advantage.full_credit``). The ratio is
taken against the behaviour log-probs recorded by ``generate_chunks``, under the same
sampling temperature. The loss is a mean over every token of the rows that the gate
lets through, so micro-batches sum to the full-batch loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ac2_core.config import AC2Config
from ac2_core.generation.hf import token_logprobs
from ac2_core.math import ppo_clip_loss
from ac2_core.models.state import update_stats
from ac2_core.models.store import ModelStore
from ac2_core.stages import data_parallel
from ac2_core.stages.common import Problems, StageStats, prompt_ids, read

STAGE = "update_actor"


def trained_rows(advantages: list[dict]) -> list[dict]:
    """Rows that carry gradient: let through by the gate, with a non-zero advantage (on some token)."""
    return [a for a in advantages if a["weight"] > 0 and any(a["token_advantages"] or [a["advantage"]])]


def ppo_batch(tok, probs: Problems, prefix_by_id: dict, chunk_by_id: dict, rows: list[dict]) -> list[tuple]:
    """(context, response, behaviour log-probs, advantages * weight) of each trained row; the
    context is the prompt's and the prefix's token ids, and the advantages one per response token."""
    prompts: dict[str, list[int]] = {}
    batch = []
    for a in rows:
        c, p = chunk_by_id[a["chunk_id"]], prefix_by_id[a["prefix_id"]]
        if a["problem_id"] not in prompts:
            prompts[a["problem_id"]] = prompt_ids(tok, probs[a["problem_id"]]["prompt"])
        per_token = a["token_advantages"] or [a["advantage"]] * len(c["token_ids"])
        if len(per_token) != len(c["token_ids"]):
            raise ValueError(
                f"advantages row {a['chunk_id']}: {len(per_token)} token advantages for a chunk of {len(c['token_ids'])} tokens"
            )
        context = prompts[a["problem_id"]] + p["prefix_token_ids"]
        batch.append((context, c["token_ids"], c["logprobs"], [x * a["weight"] for x in per_token]))
    return batch


@dataclass(frozen=True)
class ActorStats(StageStats):
    trained_chunks: int
    trained_tokens: int
    loss: float  # of the last optimizer step
    clip_fraction: float
    grad_norm: float
    policy_version: int
    actor_hash: str


@data_parallel.launches(STAGE, ActorStats)  # over training.num_processes processes, when more than one
def run(
    cfg: AC2Config,
    *,
    iteration: int,
    problems: str,
    actor: str,
    prefixes: str,
    chunks: str,
    advantages: str,
    out_actor: str,
    reference: str | None = None,
    store: ModelStore | None = None,
) -> ActorStats:
    store = store or ModelStore(cfg)
    if cfg.actor.kl_beta > 0 and reference is None:
        raise ValueError("actor.kl_beta > 0 needs the reference policy: pass reference=")
    probs = Problems.load(problems)
    prefix_by_id = {p["prefix_id"]: p for p in read(prefixes, "prefixes")}
    chunk_by_id = {c["chunk_id"]: c for c in read(chunks, "chunks")}
    adv_rows = read(advantages, "advantages")
    ckpt = store.take(actor, kind="actor")
    tok = ckpt.tokenizer
    ref_model = store.load(reference, kind="actor").model if cfg.actor.kl_beta > 0 else None

    # Every token of a row the gate lets through counts in the mean; rows with A = 0
    # add nothing to the gradient, so only rows with A != 0 are computed.
    counted = [len(chunk_by_id[a["chunk_id"]]["token_ids"]) for a in adv_rows if a["weight"] > 0]
    normalizer = sum(counted)
    rows = trained_rows(adv_rows)
    batch = ppo_batch(tok, probs, prefix_by_id, chunk_by_id, rows)
    # per-row aggregation: a row of n tokens weighs (mean length / n) a token, so each counted row adds the same
    mean_len = normalizer / len(counted) if counted else 1.0
    row_weight = (lambda n: mean_len / max(n, 1)) if cfg.actor.loss_aggregation == "row" else (lambda n: 1.0)
    mbs = [batch[i : i + cfg.actor.micro_batch_size] for i in range(0, len(batch), cfg.actor.micro_batch_size)]

    def loss_fn(model, mb):
        contexts, responses, old, adv = zip(*mb)
        kw = dict(pad_id=tok.pad_token_id, temperature=cfg.rollout.temperature)
        lp, mask = token_logprobs(model, list(contexts), list(responses), **kw)
        old_lp, per_token = torch.zeros(lp.shape), torch.zeros(lp.shape)
        for i, (o, a) in enumerate(zip(old, adv)):
            old_lp[i, : len(o)] = torch.tensor(o)
            per_token[i, : len(a)] = torch.tensor(a)
        old_lp, per_token = old_lp.to(lp.device), per_token.to(lp.device)
        ref_lp = None
        if ref_model is not None:
            with torch.no_grad():
                ref_lp, _ = token_logprobs(ref_model, list(contexts), list(responses), **kw)
        loss, stats = ppo_clip_loss(
            lp,
            old_lp,
            per_token,
            mask,
            clip_low=cfg.actor.clip_low,
            clip_high=cfg.actor.clip_high,
            ref_logprobs=ref_lp,
            kl_beta=cfg.actor.kl_beta,
            normalizer=float(normalizer),
            row_weights=torch.tensor([row_weight(len(r)) for r in responses], device=lp.device),
        )
        share = float(mask.sum()) / normalizer  # stats are per-token means: weight by this batch's tokens
        return loss, {k: v * share for k, v in stats.items()}

    trainer = store.trainer(ckpt)
    history = [trainer.step(mbs, loss_fn) for _ in range(cfg.actor.steps_per_iteration)] if mbs else []
    ckpt.version += 1
    ckpt.trained_tokens = len(history) * sum(len(ctx) + len(resp) for ctx, resp, _, _ in batch)
    figures = {"loss": "actor_loss", "clip_fraction": "clip_fraction", "grad_norm": "grad_norm", "approx_kl": "kl"}
    ckpt.stats = update_stats(history, figures)
    actor_hash = store.save(out_actor, ckpt, stage=STAGE)
    last = history[-1] if history else {}
    return ActorStats(
        trained_chunks=len(rows),
        trained_tokens=ckpt.trained_tokens,
        loss=last.get("loss", 0.0),
        clip_fraction=last.get("clip_fraction", 0.0),
        grad_norm=last.get("grad_norm", 0.0),
        policy_version=ckpt.version,
        actor_hash=actor_hash,
    )
