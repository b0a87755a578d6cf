"""evaluate: the policy's score on held-out problems, the iteration's training statistics and
compute bill, and a few decoded samples.

The metrics table is cumulative: it is last iteration's table plus one row. The actor's and
critic's training statistics come from their checkpoints' state (``models.state``); the
entropy is estimated from the behaviour log-probs of the decoded chunks. Compute is
counted from the artifacts themselves (docs/design.md section 2, step 7):
decode FLOPs per generated token at its context position, prefill once per prefix
(the G samples share it, as with prefix caching), the critic forward work recorded by
``score_chunks``, and 6N per token for both updates (as recorded in their checkpoints).
"""

from __future__ import annotations

from dataclasses import dataclass

from ac2_core.config import AC2Config
from ac2_core.generation import generate_for
from ac2_core.math import (
    attention_width,
    auc_error,
    binned_calibration_error,
    count_non_embedding_params,
    decode_flops,
    prefill_flops,
    train_flops,
)
from ac2_core.math.savings import full_rollout_tokens
from ac2_core.models.state import read_state
from ac2_core.models.store import ModelStore
from ac2_core.stages.common import Problems, StageStats, prompt_ids, read, rng_for, seed_for, write
from ac2_core.tasks import grade_many

STAGE = "evaluate"


def validation_score(cfg: AC2Config, model, tok, probs: Problems, *, model_uri: str | None = None) -> tuple[float | None, int]:
    """Mean reward of sampled answers on the validation split, and how many answers the
    grader could not score (left out of the mean; the score is None if none was scored).

    The seed is the same every iteration (common random numbers), so changes between
    iterations come from the policy, not from the draw.
    """
    val = probs.ids("val")
    if not val:
        raise ValueError("the problem set has no validation problems")
    samples = generate_for(
        cfg,
        model,
        model_uri,  # None (a model only in memory, as in the bootstrap): the hf backend
        [prompt_ids(tok, probs[pid]["prompt"]) for pid in val],
        [cfg.rollout.max_response_tokens] * len(val),
        n=cfg.eval.samples_per_problem,
        eos_id=tok.eos_token_id,
        pad_id=tok.pad_token_id,
        seed=seed_for(cfg, 0, STAGE),
        temperature=cfg.rollout.temperature,
    )
    answers = [(pid, k, s) for pid, group in zip(val, samples) for k, s in enumerate(group)]
    grades = grade_many(
        cfg.task,
        [probs[pid] for pid, _, _ in answers],
        [tok.decode(s.token_ids, skip_special_tokens=True) for _, _, s in answers],
        [f"validation answer {k} of {pid}" for pid, k, _ in answers],
    )
    rewards = [g.reward for g in grades if g.reward is not None]
    return (sum(rewards) / len(rewards) if rewards else None), len(grades) - len(rewards)


def _auc(predictions: list[float], outcomes: list[float]) -> float | None:
    """AUC of the critic's out-of-sample predictions; None without both outcomes."""
    error = auc_error(predictions, outcomes) if predictions else float("nan")
    return None if error != error else 1.0 - error


def compute_bill(model, chunks, prefixes, scored, trained_tokens: int, *, group_size: int) -> dict:
    n = count_non_embedding_params(model)
    n_layers, d_attn = attention_width(model.config)
    shape = dict(n_params=n, n_layers=n_layers, d_attn=d_attn)
    decode = sum(decode_flops(**shape, start=c["context_tokens"], n_tokens=len(c["token_ids"])) for c in chunks)
    context = {c["prefix_id"]: c["context_tokens"] for c in chunks}
    prefill = sum(prefill_flops(**shape, n_tokens=context[p["prefix_id"]]) for p in prefixes if p["prefix_id"] in context)
    prefill += sum(prefill_flops(**shape, n_tokens=p["cut_scan_tokens"]) for p in prefixes if p["cut_scan_tokens"])
    modes = {p["prefix_id"]: (p["mode"], p["problem_id"]) for p in prefixes}
    full_groups: dict[str, list[int]] = {}
    for c in chunks:
        if modes[c["prefix_id"]][0] == "full":
            full_groups.setdefault(c["prefix_id"], []).append(len(c["token_ids"]))
    chunk_problems = {modes[c["prefix_id"]][1] for c in chunks if modes[c["prefix_id"]][0] == "chunk"}
    return {
        "decode_tokens": sum(len(c["token_ids"]) for c in chunks),
        "full_rollout_tokens": full_rollout_tokens(list(full_groups.values()), len(chunk_problems), group_size),
        "decode_flops": float(decode),
        "prefill_flops": float(prefill),
        "critic_flops": float(sum(s["critic_flops"] for s in scored)),
        "train_flops": float(train_flops(n_params=n, n_tokens=trained_tokens)),
    }


STATS = ("actor_loss", "clip_fraction", "grad_norm", "kl", "critic_loss")
SAMPLES_PER_MODE = 2  # decoded samples kept per mode (full, chunk) and iteration: a few, for people to read


def training_stats(actor_state: dict, critic_state: dict, chunks: list[dict]) -> dict:
    """The update's statistics as the checkpoints recorded them (None where absent), and the
    sampled entropy: mean -log p of the decoded tokens under the behaviour policy, an unbiased
    estimate of its per-token entropy at the sampling temperature."""
    recorded = {**actor_state.get("stats", {}), **critic_state.get("stats", {})}
    logprobs = [lp for c in chunks for lp in c["logprobs"]]
    entropy = -sum(logprobs) / len(logprobs) if logprobs else None
    return {**{k: recorded.get(k) for k in STATS}, "entropy": entropy}


def decoded_samples(cfg: AC2Config, iteration: int, tok, probs: Problems, scored: list[dict]) -> list[dict]:
    """A few of the iteration's scored chunks, decoded: up to ``SAMPLES_PER_MODE`` per mode,
    finished ones first, drawn with the stage's seed (so a rerun keeps the same ones)."""
    rng = rng_for(cfg, iteration, STAGE)
    picked = []
    for mode in ("full", "chunk"):
        rows = sorted((s for s in scored if s["mode"] == mode), key=lambda s: (not s["finished"], s["chunk_id"]))
        finished = [s for s in rows if s["finished"]]
        pool = finished if len(finished) >= SAMPLES_PER_MODE else rows
        if pool:
            take = rng.choice(len(pool), size=min(SAMPLES_PER_MODE, len(pool)), replace=False)
            picked += [pool[i] for i in sorted(take)]
    return [
        {
            "run_id": cfg.run_id,
            "iteration": iteration,
            "policy_version": s["policy_version"],
            "chunk_id": s["chunk_id"],
            "problem_id": s["problem_id"],
            "mode": s["mode"],
            "prompt": probs[s["problem_id"]]["prompt"],
            "answer": tok.decode(s["response_token_ids"], skip_special_tokens=True),
            "finished": s["finished"],
            "reward": s["reward"],
            "target": s["target"],
            "target_source": s["target_source"],
        }
        for s in picked
    ]


@dataclass(frozen=True)
class EvalStats(StageStats):
    """The iteration's row of the metrics table (``schemas.METRICS``), without ``run_id``."""

    iteration: int
    policy_version: int
    val_score: float | None  # None on iterations without evaluation, or when no answer was graded
    readiness_share: float
    chunk_groups: int
    full_groups: int
    mean_train_reward: float | None
    ungraded_chunks: int
    ungraded_val: int | None
    algorithm: str
    config_hash: str
    critic_error: float | None
    critic_auc: float | None  # of this iteration's pairs, scored before the critic trained on them
    decode_tokens: int
    full_rollout_tokens: float  # what full rollouts of the same problems would have decoded
    actor_loss: float | None  # training statistics: means over the update's optimizer steps
    clip_fraction: float | None
    grad_norm: float | None
    kl: float | None
    entropy: float | None
    critic_loss: float | None
    decode_flops: float
    prefill_flops: float
    critic_flops: float
    train_flops: float
    cum_decode_tokens: int
    cum_decode_flops: float
    cum_prefill_flops: float
    cum_critic_flops: float
    cum_train_flops: float


def run(
    cfg: AC2Config,
    *,
    iteration: int,
    problems: str,
    actor: str,
    prefixes: str,
    chunks: str,
    scored_chunks: str,
    critic_pairs: str,
    readiness: str,
    critic: str | None,
    metrics: str,
    out_samples: str,
    out_metrics: str,
    store: ModelStore | None = None,
) -> EvalStats:
    store = store or ModelStore(cfg)
    probs = Problems.load(problems)
    ckpt = store.load(actor, kind="actor")
    previous = [m for m in read(metrics, "metrics") if m["iteration"] < iteration]  # a rerun replaces its own row
    prefix_rows = read(prefixes, "prefixes")
    scored = read(scored_chunks, "scored_chunks")
    pairs = read(critic_pairs, "critic_pairs")
    windows = read(readiness, "readiness")
    actor_state = read_state(actor, kind="actor")
    critic_state = read_state(critic, kind="critic") if critic is not None else {}
    trained = actor_state["trained_tokens"] + critic_state.get("trained_tokens", 0)
    chunk_rows = read(chunks, "chunks")
    bill = compute_bill(ckpt.model, chunk_rows, prefix_rows, scored, trained, group_size=cfg.rollout.group_size)

    due = iteration % cfg.eval.every == 0 or iteration >= cfg.run.iterations
    val_score, ungraded_val = validation_score(cfg, ckpt.model, ckpt.tokenizer, probs, model_uri=actor) if due else (None, None)
    finished = [s["reward"] for s in scored if s["finished"] and s["reward"] is not None]
    last = previous[-1] if previous else None
    row = {
        "run_id": cfg.run_id,
        "iteration": iteration,
        "policy_version": ckpt.version,
        "algorithm": cfg.algorithm,
        "config_hash": cfg.run_hash(),  # one value for the whole run, whatever its length
        "val_score": val_score,
        "readiness_share": sum(w["ready"] for w in windows) / len(windows) if windows else 0.0,
        "chunk_groups": sum(p["mode"] == "chunk" for p in prefix_rows),
        "full_groups": sum(p["mode"] == "full" for p in prefix_rows),
        "mean_train_reward": sum(finished) / len(finished) if finished else None,
        "ungraded_chunks": sum(s["target_source"] == "ungraded" for s in scored),
        "ungraded_val": ungraded_val,
        "critic_error": binned_calibration_error(
            [p["prediction"] for p in pairs], [p["outcome"] for p in pairs], n_bins=cfg.readiness.n_bins
        )
        if pairs
        else None,
        "critic_auc": _auc([p["prediction"] for p in pairs], [p["outcome"] for p in pairs]),
        **bill,
        **training_stats(actor_state, critic_state, chunk_rows),
    }
    for key in ("decode_tokens", "decode_flops", "prefill_flops", "critic_flops", "train_flops"):
        row[f"cum_{key}"] = (last[f"cum_{key}"] if last else 0) + row[key]
    write(cfg, STAGE, out_samples, decoded_samples(cfg, iteration, ckpt.tokenizer, probs, scored), "samples")
    write(cfg, STAGE, out_metrics, [*previous, row], "metrics")  # last: it marks the iteration finished
    return EvalStats(**{k: v for k, v in row.items() if k != "run_id"})
