"""sample_prefixes: merge last iteration's scored chunks into the replay, then pick this
iteration's problems and their prefixes (DESIGN.md section 2, step 1)."""

from __future__ import annotations

from collections import defaultdict

from ac2_core.config import AC2Config
from ac2_core.models.state import read_version
from ac2_core.replay import choose_reference, merge_replay, pick_problems, plan_prefixes, solved_recently
from ac2_core.stages.common import Problems, read, rng_for, write

STAGE = "sample_prefixes"


def _trajectories(scored: list[dict], cfg: AC2Config) -> list[dict]:
    """Each scored chunk extends its prefix into a trajectory, finished or partial."""
    return [
        {
            "run_id": cfg.run_id,
            "iteration": c["iteration"],
            "policy_version": c["policy_version"],
            "trajectory_id": c["chunk_id"],
            "problem_id": c["problem_id"],
            "source_trajectory_id": c["source_trajectory_id"],
            "token_ids": c["response_token_ids"],
            "finished": c["finished"],
            "reward": c["reward"],
        }
        for c in scored
    ]


def run(
    cfg: AC2Config,
    *,
    iteration: int,
    problems: str,
    replay: str,
    scored_chunks: str,
    readiness: str,
    actor: str,
    out_replay: str,
    out_prefixes: str,
) -> dict:
    policy_version = read_version(actor, kind="actor")
    probs = Problems.load(problems)
    train_ids = probs.ids("train")
    if not train_ids:
        raise ValueError(f"{problems}: no problems in the train split")
    merged = merge_replay(
        read(replay, "replay"),
        _trajectories(read(scored_chunks, "scored_chunks"), cfg),
        max_per_problem=cfg.replay.max_trajectories_per_problem,
    )
    by_problem: dict[str, list[dict]] = defaultdict(list)
    for t in merged:
        by_problem[t["problem_id"]].append(t)
    ready = {r["problem_id"] for r in read(readiness, "readiness") if r["ready"]}

    skipped: set[str] = set()
    if cfg.rollout.skip_solved_groups:
        skipped = {
            pid
            for pid, trajectories in by_problem.items()
            if solved_recently(
                trajectories, groups=cfg.rollout.skip_solved_groups, success_threshold=cfg.replay.success_threshold
            )
        }
    rng = rng_for(cfg, iteration, STAGE)
    chosen = pick_problems(
        [pid for pid in train_ids if pid not in skipped],
        set(by_problem),
        n=cfg.rollout.problems_per_iteration,
        revisit_fraction=cfg.rollout.revisit_fraction,
        rng=rng,
    )
    chunking_on = cfg.uses_critic and iteration > cfg.critic.warmup_iterations
    rows = []
    for pid in chosen:
        is_probe = rng.random() < cfg.rollout.probe_fraction  # drawn for every problem: one stream for all
        plans = plan_prefixes(
            pid,
            by_problem[pid],
            chunk_mode=chunking_on and pid in ready and not is_probe,
            k=cfg.rollout.prefixes_per_problem,
            chunk_tokens=cfg.rollout.chunk_tokens,
            max_response_tokens=cfg.rollout.max_response_tokens,
            rng=rng,
        )
        for k, plan in enumerate(plans):
            ref = None
            if cfg.uses_critic and cfg.critic.use_reference:
                ref = choose_reference(
                    by_problem[pid], exclude=plan.source_trajectory_id, success_threshold=cfg.replay.success_threshold
                )
            rows.append(
                {
                    "run_id": cfg.run_id,
                    "iteration": iteration,
                    "policy_version": policy_version,
                    "prefix_id": f"{pid}-i{iteration:05d}-p{k}",
                    "problem_id": pid,
                    "mode": plan.mode,
                    "source_trajectory_id": plan.source_trajectory_id,
                    "prefix_token_ids": plan.prefix_token_ids,
                    "budget": plan.budget,
                    "ref_trajectory_id": ref,
                }
            )
    write(cfg, STAGE, out_replay, merged, "replay")
    prefix_hash = write(cfg, STAGE, out_prefixes, rows, "prefixes")
    chunk_groups = sum(r["mode"] == "chunk" for r in rows)
    return {
        "problems": len(chosen),
        "prefixes": len(rows),
        "chunk_groups": chunk_groups,
        "full_groups": len(rows) - chunk_groups,
        "with_reference": sum(r["ref_trajectory_id"] is not None for r in rows),
        "skipped_solved": len(skipped),
        "replay_trajectories": len(merged),
        "prefixes_hash": prefix_hash,
    }
