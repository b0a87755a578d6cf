"""Replay state and prefix planning: pure functions over plain rows, no I/O.

The replay keeps, per problem, its newest trajectories (finished or partial). Each
iteration picks problems, decides full or chunk mode per problem, and cuts chunk-mode
prefixes at chunk boundaries of replayed trajectories (docs/design.md section 2, step 1).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np


def cut_points(length: int, chunk_tokens: int, *, finished: bool) -> list[int]:
    """Chunk boundaries at which a trajectory of ``length`` tokens may be cut.

    Multiples of ``chunk_tokens`` below ``length``; an unfinished trajectory may also be
    cut at its end (``length`` itself), which continues it.
    """
    cuts = list(range(0, length, chunk_tokens))
    if not finished and length % chunk_tokens == 0:
        cuts.append(length)
    return cuts


def least_likely_cuts(logprobs: list[float], *, limit: int, n: int) -> list[int]:
    """The ``n`` positions below ``limit`` whose tokens were least likely, least likely first.

    A prefix cut right before such a token is where a group's continuations most often
    branch: each of them draws that token again. Ties go to the earlier position.
    """
    return _first_by(logprobs, limit=limit, n=n)


def highest_entropy_cuts(entropies: list[float], *, limit: int, n: int) -> list[int]:
    """The ``n`` positions below ``limit`` where the policy's next-token distribution had the
    most entropy, highest first; ties go to the earlier position.

    Unlike the least likely token, which is wherever the sampled answer happened to slip, this
    is where the policy itself could go several ways (a forking token), whichever way the
    trajectory went: a group's continuations cut there part as often as the policy is unsure.
    """
    return _first_by([-h for h in entropies], limit=limit, n=n)


def _first_by(keys: list[float], *, limit: int, n: int) -> list[int]:
    """The ``n`` positions below ``limit`` with the smallest keys, smallest first, ties to the earlier."""
    positions = range(min(limit, len(keys)))
    return sorted(positions, key=lambda p: (keys[p], p))[:n]


def _newest_first(row: dict) -> tuple:
    return (-row["iteration"], -row["policy_version"], row["trajectory_id"])


def _graded_whole_answer(t: dict) -> bool:
    """A full-mode trajectory that finished with a reward: the problem solved (or not) from scratch."""
    return t["source_trajectory_id"] is None and t["finished"] and t["reward"] is not None


def succeeded(t: dict, success_threshold: float) -> bool:
    """A finished trajectory whose reward reaches ``success_threshold``: a success, one a critic may be shown."""
    return t["finished"] and t["reward"] is not None and t["reward"] >= success_threshold


def choose_reference(
    trajectories: Iterable[dict],
    *,
    exclude: str | None,
    success_threshold: float,
    or_excluded: bool | Literal["always"] = False,
    preference: Mapping[str, float] | None = None,
    lucky: Collection[str] = (),
) -> str | None:
    """The latest successful finished trajectory of one problem other than ``exclude``; with
    ``or_excluded``, ``exclude`` itself when it is the only success, and with ``"always"``,
    ``exclude`` itself whenever it is a success.

    ``exclude`` is the trajectory a chunk's prefix was cut from. Its continuations are fresh
    answers, so showing it leaks no outcome; ``critic.source_reference`` sets ``or_excluded``,
    and by default such a prefix has no reference. Shown its own source, a prefix agrees with
    its reference up to the cut, so what the critic reads of the match is the continuation's
    alone; another success may have taken a route the prefix did not (research log section 25).

    With ``preference`` (a number for each success, higher first), the most preferred success
    instead of the latest, the latest among equals. A success in ``lucky`` is never shown: one
    that left the worked route and came back by a second error leads a critic that follows it
    astray (docs/algorithm.md, research log sections 21, 22 and 27). ``critic.reference_min_logprob``
    prefers the likeliest success under the current actor and ``replay.success_repeats`` the one
    most whole answers wrote; each sets its own lucky ones apart.
    """
    ok = [t for t in trajectories if succeeded(t, success_threshold) and t["trajectory_id"] not in lucky]
    key = _newest_first
    if preference is not None:
        key = lambda t: (-preference[t["trajectory_id"]], *_newest_first(t))  # noqa: E731
    if or_excluded == "always" and any(t["trajectory_id"] == exclude for t in ok):
        return exclude
    others = [t for t in ok if t["trajectory_id"] != exclude]
    pick = others or (ok if or_excluded else [])
    return min(pick, key=key)["trajectory_id"] if pick else None


def success_repeats(trajectories: Iterable[dict], success_threshold: float) -> dict[str, int]:
    """Each success of one problem's replay: how many of the problem's whole answers (finished
    full-mode trajectories, itself included where it is one) wrote exactly its tokens.

    Where a task has one canonical answer text (arith's worked solution), the policy writes a
    success on the route again and again, while one that came back by a second error, cancelling
    the first, is seldom written twice (``replay.success_repeats``)."""
    trajectories = list(trajectories)
    written = Counter(tuple(t["token_ids"]) for t in trajectories if t["source_trajectory_id"] is None and t["finished"])
    return {t["trajectory_id"]: written[tuple(t["token_ids"])] for t in trajectories if succeeded(t, success_threshold)}


def unrepeated_successes(repeats: Mapping[str, int], min_repeats: int) -> set[str]:
    """The successes in ``repeats`` (``success_repeats``) written fewer than ``min_repeats`` times."""
    return {tid for tid, n in repeats.items() if n < min_repeats}


def lucky_successes(likelihood: Mapping[str, float], min_logprob: float | None) -> set[str]:
    """The successes in ``likelihood`` whose summed log-probability falls below ``min_logprob``
    (none without one): answers that succeeded by a route the policy seldom takes, such as a
    slip that cancels an earlier error."""
    if min_logprob is None:
        return set()
    return {tid for tid, logprob in likelihood.items() if logprob < min_logprob}


def merge_replay(replay: list[dict], new: list[dict], *, max_per_problem: int, whole_first: bool = False) -> list[dict]:
    """Add ``new`` trajectories and keep the newest ``max_per_problem`` of each problem.

    With ``whole_first``, whole answers (full-mode trajectories) are kept ahead of
    continuations stitched onto a prefix, newest first within each: a continuation then
    takes only a slot no whole answer needs. Where chunk-mode prefixes are cut from whole
    answers alone (``rollout.prefix_max_age``), the continuations of two chunk groups a visit
    would otherwise push a problem's fresh answers out within two visits (research log,
    section 11)."""
    by_problem: dict[str, list[dict]] = defaultdict(list)
    seen = set()
    for row in [*new, *replay]:  # a rerun's rows replace older copies with the same id
        if row["trajectory_id"] not in seen:
            seen.add(row["trajectory_id"])
            by_problem[row["problem_id"]].append(row)
    merged = []
    for pid in sorted(by_problem):
        key = (lambda t: (t["source_trajectory_id"] is not None, *_newest_first(t))) if whole_first else _newest_first
        merged.extend(sorted(by_problem[pid], key=key)[:max_per_problem])
    return merged


def pick_problems(
    train_ids: list[str], replayed_ids: set[str], *, n: int, revisit_fraction: float, rng: np.random.Generator
) -> list[str]:
    """Draw ``n`` distinct problems: ``revisit_fraction`` of them from problems with replay.

    Revisiting is what lets AC2 continue past trajectories at all: with 16 problems a
    step from a pool of thousands, a problem would come back once in ~100 iterations
    (docs/design.md section 7). The rule does not depend on the algorithm, so GRPO draws the
    same way.
    """
    if not train_ids:
        raise ValueError("the problem set has no training problems")
    n = min(n, len(train_ids))
    revisit = sorted(replayed_ids & set(train_ids))
    k = min(len(revisit), int(round(n * revisit_fraction)))
    chosen = [revisit[i] for i in rng.choice(len(revisit), size=k, replace=False)] if k else []
    rest = sorted(set(train_ids) - set(chosen))
    chosen += [rest[i] for i in rng.choice(len(rest), size=n - k, replace=False)]
    return sorted(chosen)


def solved_recently(trajectories: Iterable[dict], *, groups: int, success_threshold: float) -> bool:
    """Whether the problem's last ``groups`` full groups (one per iteration) were all solved.

    Only finished full-mode trajectories count: a chunk continues someone else's prefix,
    so its success says little about the problem from scratch. With fewer than ``groups``
    groups in the replay the answer is no.
    """
    by_iteration: dict[int, list[float]] = {}
    for t in trajectories:
        if _graded_whole_answer(t):
            by_iteration.setdefault(t["iteration"], []).append(t["reward"])
    recent = sorted(by_iteration, reverse=True)[:groups]
    return len(recent) == groups and all(r >= success_threshold for it in recent for r in by_iteration[it])


def whole_answer_rate(trajectories: Iterable[dict]) -> float | None:
    """A problem's success rate from scratch, as its replay knows it: the mean reward of its
    graded whole answers (full-mode trajectories; a continuation's outcome belongs to the state
    it was cut at), add-half smoothed, ``(sum + 0.5) / (n + 1)``, so that it is never 0 or 1.
    None when the replay holds no graded whole answer.

    The baseline of a full-mode answer under ``advantage.full_groups: replay_rate``. It depends
    on the problem alone, not on the answer it is compared with, so the policy gradient stays
    unbiased however stale it is; staleness only adds variance.
    """
    rewards = [t["reward"] for t in trajectories if _graded_whole_answer(t)]
    return (sum(rewards) + 0.5) / (len(rewards) + 1) if rewards else None


@dataclass(frozen=True)
class PlannedPrefix:
    problem_id: str
    mode: str  # full | chunk
    source_trajectory_id: str | None
    prefix_token_ids: list[int]
    budget: int


def plan_prefixes(
    problem_id: str,
    trajectories: list[dict],
    *,
    chunk_mode: bool,
    k: int,
    chunk_tokens: int,
    max_response_tokens: int,
    rng: np.random.Generator,
    success_threshold: float | None = None,
    only_successes: bool = False,
    since_iteration: int | None = None,
    lucky: Collection[str] = (),
) -> list[PlannedPrefix]:
    """Full mode: one empty prefix with the whole budget. Chunk mode: up to ``k`` prefixes
    cut at chunk boundaries of replayed trajectories, each with budget ``chunk_tokens``.

    With ``since_iteration``, prefixes are cut only from whole answers (full-mode
    trajectories, not continuations stitched onto an older prefix) sampled at that
    iteration or later; a problem without one is planned in full mode, which gives it a
    fresh answer. Left alone, a problem kept in chunk mode is continued from states an
    ever older policy wrote (docs/algorithm.md, research log section 10).

    With ``success_threshold``, prefixes are cut only from the trajectories that finished
    with at least that reward, when the problem has any: a state on a path that succeeded
    can still succeed, so its continuations can differ in outcome, where a state past an
    answer's fatal error teaches nothing (every continuation fails alike). With
    ``only_successes`` too, a problem without one is planned in full mode. A success in
    ``lucky`` (``lucky_successes``, ``unrepeated_successes``) does not count as one.
    """
    full = [PlannedPrefix(problem_id, "full", None, [], max_response_tokens)]
    if not chunk_mode:
        return full
    if since_iteration is not None:
        trajectories = [t for t in trajectories if t["source_trajectory_id"] is None and t["iteration"] >= since_iteration]
    if success_threshold is not None:
        won = [t for t in trajectories if succeeded(t, success_threshold) and t["trajectory_id"] not in lucky]
        trajectories = won if only_successes else won or trajectories
    candidates = [
        (t, cut)
        for t in sorted(trajectories, key=_newest_first)
        for cut in cut_points(len(t["token_ids"]), chunk_tokens, finished=t["finished"])
        if cut < max_response_tokens
    ]
    if not candidates:
        return full
    picks = rng.choice(len(candidates), size=min(k, len(candidates)), replace=False)
    return [
        PlannedPrefix(
            problem_id,
            "chunk",
            t["trajectory_id"],
            list(t["token_ids"][:cut]),
            min(chunk_tokens, max_response_tokens - cut),
        )
        for t, cut in (candidates[i] for i in sorted(picks))
    ]
