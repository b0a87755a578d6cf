"""sample_prefixes: merge last iteration's scored chunks into the replay, then pick this
iteration's problems and their prefixes (docs/design.md section 2, step 1)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ac2_core.config import AC2Config
from ac2_core.models.state import read_version
from ac2_core.replay import choose_reference, merge_replay, pick_problems, plan_prefixes, solved_recently
from ac2_core.stages.common import Problems, StageStats, read, rng_for, write

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


@dataclass(frozen=True)
class SampleStats(StageStats):
    problems: int
    prefixes: int
    chunk_groups: int
    full_groups: int
    with_reference: int  # groups whose critic sees a reference solution
    skipped_solved: int  # problems left out by rollout.skip_solved_groups
    replay_trajectories: int
    prefixes_hash: str


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
) -> SampleStats:
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
    skipped = _solved_recently(cfg, by_problem)
    rng = rng_for(cfg, iteration, STAGE)
    chosen = pick_problems(
        [pid for pid in train_ids if pid not in skipped],
        set(by_problem),
        n=cfg.rollout.problems_per_iteration,
        revisit_fraction=cfg.rollout.revisit_fraction,
        rng=rng,
    )
    rows = [
        {"run_id": cfg.run_id, "iteration": iteration, "policy_version": policy_version, **plan}
        for pid in chosen
        for plan in _plans(cfg, iteration, pid, by_problem[pid], ready, rng)
    ]
    write(cfg, STAGE, out_replay, merged, "replay")
    prefix_hash = write(cfg, STAGE, out_prefixes, rows, "prefixes")
    chunk_groups = sum(r["mode"] == "chunk" for r in rows)
    return SampleStats(
        problems=len(chosen),
        prefixes=len(rows),
        chunk_groups=chunk_groups,
        full_groups=len(rows) - chunk_groups,
        with_reference=sum(r["ref_trajectory_id"] is not None for r in rows),
        skipped_solved=len(skipped),
        replay_trajectories=len(merged),
        prefixes_hash=prefix_hash,
    )


def _solved_recently(cfg: AC2Config, by_problem: dict[str, list[dict]]) -> set[str]:
    """The problems ``rollout.skip_solved_groups`` leaves out (none when it is 0)."""
    if not cfg.rollout.skip_solved_groups:
        return set()
    return {
        pid
        for pid, trajectories in by_problem.items()
        if solved_recently(trajectories, groups=cfg.rollout.skip_solved_groups, success_threshold=cfg.replay.success_threshold)
    }


def _plans(cfg: AC2Config, iteration: int, pid: str, trajectories: list[dict], ready: set[str], rng: np.random.Generator):
    """The prefixes rows of one chosen problem (without run_id, iteration and policy_version).

    ``rng`` is the stage's one stream: every problem draws its probe flag, then its plans."""
    chunking_on = cfg.uses_critic and iteration > cfg.critic.warmup_iterations
    is_probe = rng.random() < cfg.rollout.probe_fraction  # drawn for every problem: one stream for all
    plans = plan_prefixes(
        pid,
        trajectories,
        chunk_mode=chunking_on and pid in ready and not is_probe,
        k=cfg.rollout.prefixes_per_problem,
        chunk_tokens=cfg.rollout.chunk_tokens,
        max_response_tokens=cfg.rollout.max_response_tokens,
        rng=rng,
        success_threshold=cfg.replay.success_threshold if cfg.rollout.prefix_source == "success" else None,
    )
    for k, plan in enumerate(plans):
        ref = None
        if cfg.uses_critic and cfg.critic.use_reference:
            ref = choose_reference(
                trajectories, exclude=plan.source_trajectory_id, success_threshold=cfg.replay.success_threshold
            )
        yield {
            "prefix_id": f"{pid}-i{iteration:05d}-p{k}",
            "problem_id": pid,
            "mode": plan.mode,
            "source_trajectory_id": plan.source_trajectory_id,
            "prefix_token_ids": plan.prefix_token_ids,
            "budget": plan.budget,
            "ref_trajectory_id": ref,
        }
