"""sample_prefixes: merge last iteration's scored chunks into the replay, then pick this
iteration's problems and their prefixes (docs/design.md section 2, step 1)."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ac2_core.config import AC2Config
from ac2_core.models.state import read_version
from ac2_core.models.store import ModelStore
from ac2_core.replay import (
    choose_reference,
    highest_entropy_cuts,
    least_likely_cuts,
    lucky_successes,
    merge_replay,
    pick_problems,
    plan_prefixes,
    solved_recently,
    succeeded,
    success_repeats,
    unrepeated_successes,
    whole_answer_rate,
)
from ac2_core.stages.common import Problems, StageStats, prompt_ids, read, rng_for, write

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
    store: ModelStore | None = None,
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
        whole_first=cfg.replay.whole_answers_first,
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
    store = store or ModelStore(cfg)
    policy = functools.cache(lambda: store.load(actor, kind="actor"))  # loaded once, by the first read that needs it
    likely = None
    if cfg.uses_critic and cfg.critic.use_reference and cfg.critic.reference_min_logprob is not None:
        likely = _success_likelihoods(cfg, {pid: by_problem[pid] for pid in chosen}, probs, policy)
    rows = []
    for pid in chosen:
        plans = [
            {"run_id": cfg.run_id, "iteration": iteration, "policy_version": policy_version, **plan}
            for plan in _plans(cfg, iteration, pid, by_problem[pid], ready, rng, likely.logprob if likely else None)
        ]
        if likely and likely.scanned.get(pid):  # the problem's scan, billed once, on its first row
            plans[0]["cut_scan_tokens"] = likely.scanned[pid]
        rows.extend(plans)
    if cfg.rollout.prefix_cut != "boundary":
        rows = _cut_where_uncertain(cfg, rows, merged, probs, policy)
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


def _actor_read(
    cfg: AC2Config, policy: Callable, probs: Problems, trajectories: list[dict], score: Callable, reduce: Callable
) -> tuple[dict[str, object], dict[str, int]]:
    """Read each trajectory's answer (cut at ``rollout.max_response_tokens``) with the current
    actor after its problem's prompt, a micro-batch at a time, at the rollout temperature.

    ``score`` (``generation.hf.token_logprobs`` or ``token_entropies``) gives a batch's (B, T)
    values and mask, and ``reduce`` turns them into one item a row. Returns the items and the
    tokens read (prompt and answer, billed as prefill), both by trajectory id."""
    import torch

    limit = cfg.rollout.max_response_tokens
    actor = policy()
    tok = actor.tokenizer
    contexts = [prompt_ids(tok, probs[t["problem_id"]]["prompt"]) for t in trajectories]
    answers = [t["token_ids"][:limit] for t in trajectories]
    items: dict[str, object] = {}
    step, kw = cfg.actor.micro_batch_size, dict(pad_id=tok.pad_token_id, temperature=cfg.rollout.temperature)
    with torch.no_grad():
        for i in range(0, len(trajectories), step):
            values, mask = score(actor.model, contexts[i : i + step], answers[i : i + step], **kw)
            for t, item in zip(trajectories[i : i + step], reduce(values, mask)):
                items[t["trajectory_id"]] = item
    read_tokens = {t["trajectory_id"]: len(c) + len(a) for t, c, a in zip(trajectories, contexts, answers)}
    return items, read_tokens


def _per_token(values, mask) -> list[list[float]]:
    """An ``_actor_read`` reduction: each row's values at its answer's tokens."""
    return [row[:n] for row, n in zip(values.cpu().tolist(), mask.sum(-1).int().tolist())]


def _summed(values, mask) -> list[float]:
    """An ``_actor_read`` reduction: each row's values summed over its answer's tokens."""
    return (values * mask).sum(-1).double().cpu().tolist()


def _cut_where_uncertain(
    cfg: AC2Config, rows: list[dict], trajectories: list[dict], probs: Problems, policy: Callable
) -> list[dict]:
    """Move each chunk-mode prefix's end to right before the token of its trajectory that the
    current actor finds least likely (``rollout.prefix_cut: uncertain``), or to right before the
    position where its next-token distribution has the most entropy (``entropy``); the second
    prefix cut from one trajectory goes to the second such position, and so on. Its
    continuations then all draw that token again, so they branch there far more often than at a
    chunk boundary, where most of a sharp policy's continuations are the same text
    (docs/algorithm.md, research log sections 9 and 17). ``policy`` loads the actor."""
    from ac2_core.generation.hf import token_entropies, token_logprobs

    match cfg.rollout.prefix_cut:
        case "uncertain":
            score, rank = token_logprobs, least_likely_cuts
        case "entropy":
            score, rank = token_entropies, highest_entropy_cuts

    by_id = {t["trajectory_id"]: t for t in trajectories}
    limit = cfg.rollout.max_response_tokens
    sources = sorted({r["source_trajectory_id"] for r in rows if r["mode"] == "chunk"} - {None})
    sources = [by_id[s] for s in sources if by_id[s]["token_ids"]]
    if not sources:
        return rows
    scores, scanned = _actor_read(cfg, policy, probs, sources, score, _per_token)
    # one problem's prefixes are the most cut from one trajectory
    cuts = {s: rank(v, limit=limit, n=cfg.rollout.prefixes_per_problem) for s, v in scores.items()}
    taken: dict[str, int] = defaultdict(int)
    out = []
    for r in rows:
        s = r["source_trajectory_id"]
        if r["mode"] == "chunk" and s in cuts:
            if taken[s] < len(cuts[s]):  # a trajectory with fewer tokens than prefixes keeps its boundary cuts
                cut = cuts[s][taken[s]]
                billed = r["cut_scan_tokens"] or 0  # the problem's reference scan, if any
                r = r | {
                    "prefix_token_ids": list(by_id[s]["token_ids"][:cut]),
                    "budget": min(cfg.rollout.chunk_tokens, limit - cut),
                    "cut_scan_tokens": billed + scanned[s] if taken[s] == 0 else r["cut_scan_tokens"],  # one scan a trajectory
                }
            taken[s] += 1
        out.append(r)
    return out


@dataclass(frozen=True)
class _Likelihoods:
    logprob: dict[str, float]  # each success of the chosen problems: its summed log-probability under the actor
    scanned: dict[str, int]  # tokens the actor read, per problem


def _success_likelihoods(cfg: AC2Config, trajectories: dict[str, list[dict]], probs: Problems, policy: Callable) -> _Likelihoods:
    """Each success of the given problems, weighed by how likely the current actor is to write it
    again: its tokens' summed log-probability at the rollout temperature (``critic.reference_min_logprob``).

    The critic follows the reference it is shown, so a success that left the worked route and came
    back by a second error leads it to rate highly the continuations that leave the route the same
    way (docs/algorithm.md, research log section 21). Two errors make such a success less likely as
    a whole than one on the route, as a rule. Not where the policy makes both errors by habit:
    there it is the most likely success, which is why this stays off (research log section 22)."""
    from ac2_core.generation.hf import token_logprobs

    threshold = cfg.replay.success_threshold
    successes = sorted(
        (t for ts in trajectories.values() for t in ts if succeeded(t, threshold) and t["token_ids"]),
        key=lambda t: t["trajectory_id"],
    )
    if not successes:
        return _Likelihoods({}, {})
    logprob, read_tokens = _actor_read(cfg, policy, probs, successes, token_logprobs, _summed)
    scanned: dict[str, int] = defaultdict(int)
    for t in successes:
        scanned[t["problem_id"]] += read_tokens[t["trajectory_id"]]
    return _Likelihoods(logprob, dict(scanned))


def _solved_recently(cfg: AC2Config, by_problem: dict[str, list[dict]]) -> set[str]:
    """The problems ``rollout.skip_solved_groups`` leaves out (none when it is 0)."""
    if not cfg.rollout.skip_solved_groups:
        return set()
    return {
        pid
        for pid, trajectories in by_problem.items()
        if solved_recently(trajectories, groups=cfg.rollout.skip_solved_groups, success_threshold=cfg.replay.success_threshold)
    }


def _trusted(
    cfg: AC2Config, trajectories: list[dict], likelihood: dict[str, float] | None
) -> tuple[Mapping[str, float] | None, set[str]]:
    """One problem's successes as the config weighs them: how much each is preferred as a
    reference (None: the latest is), and the lucky ones, neither references nor prefix sources.
    By likelihood under the current actor (``critic.reference_min_logprob``), by how many whole
    answers wrote each (``replay.success_repeats``), or neither."""
    if likelihood is not None:
        return likelihood, lucky_successes(likelihood, cfg.critic.reference_min_logprob)
    if cfg.replay.success_repeats > 1:
        repeats = success_repeats(trajectories, cfg.replay.success_threshold)
        return repeats, unrepeated_successes(repeats, cfg.replay.success_repeats)
    return None, set()


def _plans(
    cfg: AC2Config,
    iteration: int,
    pid: str,
    trajectories: list[dict],
    ready: set[str],
    rng: np.random.Generator,
    likelihood: dict[str, float] | None = None,
):
    """The prefixes rows of one chosen problem (without run_id, iteration and policy_version).

    ``rng`` is the stage's one stream: every problem draws its probe flag, then its plans.
    ``likelihood`` (``_success_likelihoods``) picks the references and sets the lucky successes apart."""
    preference, lucky = _trusted(cfg, trajectories, likelihood)
    chunking_on = cfg.chunking_on(iteration)
    is_probe = rng.random() < cfg.rollout.probe_fraction  # drawn for every problem: one stream for all
    plans = plan_prefixes(
        pid,
        trajectories,
        chunk_mode=chunking_on and pid in ready and not is_probe,
        k=cfg.rollout.prefixes_per_problem,
        chunk_tokens=cfg.rollout.chunk_tokens,
        max_response_tokens=cfg.rollout.max_response_tokens,
        rng=rng,
        success_threshold=cfg.replay.success_threshold if cfg.rollout.prefix_source != "any" else None,
        only_successes=cfg.rollout.prefix_source == "success_only",
        since_iteration=None if cfg.rollout.prefix_max_age is None else iteration - cfg.rollout.prefix_max_age,
        lucky=lucky,
    )
    # a revisited problem's full-mode answers measured against its replayed success rate (one answer may do)
    rate = whole_answer_rate(trajectories) if cfg.replay_rate_on(iteration) else None
    for k, plan in enumerate(plans):
        ref = None
        if cfg.uses_critic and cfg.critic.use_reference:
            ref = choose_reference(
                trajectories,
                exclude=plan.source_trajectory_id,
                success_threshold=cfg.replay.success_threshold,
                or_excluded=cfg.critic.source_reference,  # the only success may be the source (research log, section 19)
                preference=preference,
                lucky=lucky,
            )
        yield {
            "prefix_id": f"{pid}-i{iteration:05d}-p{k}",
            "problem_id": pid,
            "mode": plan.mode,
            "source_trajectory_id": plan.source_trajectory_id,
            "prefix_token_ids": plan.prefix_token_ids,
            "budget": plan.budget,
            "ref_trajectory_id": ref,
            "baseline_rate": rate if plan.mode == "full" else None,
            "cut_scan_tokens": None,
        }
