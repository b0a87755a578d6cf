"""check_readiness: per-problem critic readiness, then chunk advantages behind the gate
(docs/design.md section 2, step 4).

AC2: each problem keeps a sliding window of out-of-sample (prediction, outcome) pairs;
it is ready when the window is large and calibrated enough. Advantages are
``A(c) = y(c) - b`` per group (one prefix, G chunks), and on a problem that is not ready
now, chunks whose target came from the critic get weight 0. A full-mode group (G whole
answers) gets GRPO's advantage by default (``advantage.full_groups``): the same answers
must teach the same thing under either algorithm. Under ``replay_rate`` a revisited
problem's full-mode answers (one may be all it has) are measured against its replayed
success rate instead (``math.replay_rate_advantages``). Under ``advantage.full_credit:
critic`` a finished full-mode answer on a ready problem gets one advantage per token
instead, once the critic's warm-up is over: each chunk of it the change in V it brought
(``math.critic_credit``), read off the critic's out-of-sample predictions at its chunk
boundaries (this iteration's pairs).

GRPO: group-normalized terminal rewards (``math.grpo_advantages``), weight 1, and an
empty readiness table; under ``replay_rate`` its revisited problems' answers are measured
against their replayed success rate as AC2's are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ac2_core.config import AC2Config
from ac2_core.math import critic_credit, gate_weights, group_advantages, grpo_advantages, is_ready, replay_rate_advantages
from ac2_core.replay import cut_points
from ac2_core.stages.common import StageStats, read, write

STAGE = "check_readiness"


def update_windows(cfg: AC2Config, previous: list[dict], pairs: list[dict], iteration: int) -> list[dict]:
    """Append this iteration's pairs to each problem's window and re-judge readiness."""
    windows = {r["problem_id"]: (list(r["predictions"]), list(r["outcomes"])) for r in previous}
    for p in sorted(pairs, key=lambda p: p["pair_id"]):
        preds, outs = windows.setdefault(p["problem_id"], ([], []))
        preds.append(p["prediction"])
        outs.append(p["outcome"])
    rows = []
    w = cfg.readiness.window
    for pid in sorted(windows):
        preds, outs = windows[pid][0][-w:], windows[pid][1][-w:]
        ready, error = is_ready(
            preds,
            outs,
            metric=cfg.readiness.metric,
            min_pairs=cfg.readiness.min_pairs,
            max_error=cfg.readiness.max_error,
            require_mixed_outcomes=cfg.readiness.require_mixed_outcomes,
            n_bins=cfg.readiness.n_bins,
            min_auc=cfg.readiness.min_auc,
        )
        rows.append(
            {
                "run_id": cfg.run_id,
                "iteration": iteration,
                "problem_id": pid,
                "predictions": preds,
                "outcomes": outs,
                "error": None if error != error else error,  # nan -> null: undefined on this window
                "ready": ready or not cfg.readiness.gate,  # gate off: the critic is always trusted
            }
        )
    return rows


def advantages(
    cfg: AC2Config, scored: list[dict], ready: set[str], pairs: Sequence[dict] = (), *, credit: bool = True
) -> list[dict]:
    """One row per scored chunk, in order. An ungraded chunk (its grader failed) gets
    weight 0 and no target, and is left out of its group's baseline: the others' advantages
    are computed as if it had not been sampled. ``pairs`` (this iteration's critic pairs)
    give the values along each answer that ``advantage.full_credit: critic`` needs; with
    ``credit`` False (the critic's warm-up) every answer keeps its one advantage."""
    graded = {r["chunk_id"]: r for r in _graded_advantages(cfg, [s for s in scored if s["target_source"] != "ungraded"], ready)}
    if cfg.uses_critic and cfg.advantage.full_credit == "critic" and credit:
        _credit_along(cfg, scored, ready, pairs, graded)
    masked = dict(target=None, baseline=0.0, advantage=0.0, weight=0.0, token_advantages=None)
    keys = ("run_id", "iteration", "policy_version", "chunk_id", "prefix_id", "problem_id")
    return [graded.get(s["chunk_id"]) or {**{k: s[k] for k in keys}, **masked} for s in scored]


def _credit_along(cfg: AC2Config, scored: list[dict], ready: set[str], pairs: Sequence[dict], graded: dict[str, dict]) -> None:
    """Give each finished, graded full-mode answer of a ready problem the critic's credit along
    it: per-token advantages, the baseline ``V(s_0)`` and the advantage ``R - V(s_0)`` (what they
    sum to over its segments at ``advantage.credit_lambda`` 0). Its values are the pairs
    ``score_chunks`` made at the answer's cut points (``replay.cut_points``).

    ``advantage.credit_needs_reference`` leaves the answers whose critic was shown no reference
    their outcome advantage; ``advantage.credit_scale`` divides the credit by the std the outcome
    advantage was divided by, ``(R - b) / A`` of the outcome row."""
    along = {(p["trajectory_id"], p["cut"]): p["prediction"] for p in pairs}
    for s in scored:
        row = graded.get(s["chunk_id"])
        if row is None or s["mode"] != "full" or not s["finished"] or s["problem_id"] not in ready:
            continue
        if cfg.advantage.credit_needs_reference and s["ref_trajectory_id"] is None:
            continue
        length = len(s["response_token_ids"])
        values = [along.get((s["chunk_id"], cut)) for cut in cut_points(length, cfg.rollout.chunk_tokens, finished=True)]
        if None in values:
            raise ValueError(f"full-mode answer {s['chunk_id']}: no critic values along it for advantage.full_credit critic")
        credit = critic_credit(values, s["reward"], length, cfg.rollout.chunk_tokens, lam=cfg.advantage.credit_lambda)
        # the outcome row's A / (R - b); an advantage of 0 has no spread to scale by (R = b)
        scale = row["advantage"] / (s["reward"] - row["baseline"]) if cfg.advantage.credit_scale and row["advantage"] else 1.0
        row.update(baseline=values[0], advantage=(s["reward"] - values[0]) * scale, token_advantages=[a * scale for a in credit])


def _graded_advantages(cfg: AC2Config, scored: list[dict], ready: set[str]) -> list[dict]:
    if not scored:
        return []
    group_index = {g: i for i, g in enumerate(sorted({s["prefix_id"] for s in scored}))}
    groups = torch.tensor([group_index[s["prefix_id"]] for s in scored])
    targets = torch.tensor([s["target"] for s in scored], dtype=torch.float32)
    if cfg.uses_critic:
        starts = [s["value_start"] for s in scored]
        weights = gate_weights(
            torch.tensor([s["target_source"] == "critic" for s in scored]),
            torch.tensor([s["problem_id"] in ready for s in scored]),
        )
        adv, base = group_advantages(
            targets,
            groups,
            baseline=cfg.advantage.baseline,
            values_start=torch.tensor(starts, dtype=torch.float32) if None not in starts else None,
            scale_std=cfg.advantage.scale_std,
            std_floor=cfg.advantage.std_floor,
        )
        if cfg.advantage.full_groups in ("grpo", "replay_rate"):
            full = torch.tensor([s["mode"] == "full" for s in scored])
            grpo_adv, grpo_base = grpo_advantages(targets, groups, scale_std=cfg.advantage.grpo_scale_std)
            adv, base = torch.where(full, grpo_adv, adv), torch.where(full, grpo_base, base)
    else:
        weights = torch.ones_like(targets)
        adv, base = grpo_advantages(targets, groups, scale_std=cfg.advantage.grpo_scale_std)
    if cfg.advantage.full_groups == "replay_rate":  # either algorithm: the rows whose prefix carries a rate
        has_rate = torch.tensor([s["baseline_rate"] is not None for s in scored])
        rate = torch.tensor([s["baseline_rate"] if s["baseline_rate"] is not None else 0.5 for s in scored])
        rate_adv = replay_rate_advantages(targets, rate, scale_std=cfg.advantage.grpo_scale_std)
        adv, base = torch.where(has_rate, rate_adv, adv), torch.where(has_rate, rate, base)
    return [
        {
            "run_id": s["run_id"],
            "iteration": s["iteration"],
            "policy_version": s["policy_version"],
            "chunk_id": s["chunk_id"],
            "prefix_id": s["prefix_id"],
            "problem_id": s["problem_id"],
            "target": s["target"],
            "baseline": float(b),
            "advantage": float(a),
            "weight": float(w),
            "token_advantages": None,
        }
        for s, a, b, w in zip(scored, adv.tolist(), base.tolist(), weights.tolist())
    ]


@dataclass(frozen=True)
class ReadinessStats(StageStats):
    ungraded_chunks: int
    problems_with_window: int
    ready_problems: int
    readiness_share: float
    gated_chunks: int
    mean_abs_advantage: float  # over the rows the gate lets through
    advantages_hash: str


def run(
    cfg: AC2Config,
    *,
    iteration: int,
    readiness: str,
    critic_pairs: str,
    scored_chunks: str,
    out_readiness: str,
    out_advantages: str,
) -> ReadinessStats:
    scored = read(scored_chunks, "scored_chunks")
    pairs = read(critic_pairs, "critic_pairs") if cfg.uses_critic else []
    windows = update_windows(cfg, read(readiness, "readiness"), pairs, iteration) if cfg.uses_critic else []
    ready = {w["problem_id"] for w in windows if w["ready"]}
    # credit waits out the critic's warm-up, as chunk mode does: a critic fitted on few pairs or none
    # is flat, and flat values put all of an answer's credit on its last chunk (research log section 14)
    rows = advantages(cfg, scored, ready, pairs, credit=cfg.chunking_on(iteration))
    write(cfg, STAGE, out_readiness, windows, "readiness")
    adv_hash = write(cfg, STAGE, out_advantages, rows, "advantages")
    active = [r for r in rows if r["weight"] > 0]
    return ReadinessStats(
        ungraded_chunks=sum(r["target"] is None for r in rows),
        problems_with_window=len(windows),
        ready_problems=len(ready),
        readiness_share=len(ready) / len(windows) if windows else 0.0,
        gated_chunks=len(rows) - len(active),
        mean_abs_advantage=sum(abs(r["advantage"]) for r in active) / len(active) if active else 0.0,
        advantages_hash=adv_hash,
    )
