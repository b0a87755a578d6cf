"""Replay and prefix planning on hand-worked cases (each expected value derived in a comment)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ac2_core.replay import (
    PlannedPrefix,
    choose_reference,
    cut_points,
    highest_entropy_cuts,
    least_likely_cuts,
    lucky_successes,
    merge_replay,
    pick_problems,
    plan_prefixes,
    solved_recently,
    success_repeats,
    unrepeated_successes,
    whole_answer_rate,
)


def _traj(tid: str, *, iteration: int, pv: int, finished: bool, reward: float | None, n: int = 8, problem: str = "p0") -> dict:
    return {
        "run_id": "toy",
        "iteration": iteration,
        "policy_version": pv,
        "trajectory_id": tid,
        "problem_id": problem,
        "source_trajectory_id": None,
        "token_ids": [1000 * iteration + i for i in range(n)],
        "finished": finished,
        "reward": reward,
    }


# ------------------------------------------------------------------ cut_points


@pytest.mark.parametrize(
    "length, finished, expected",
    [
        # 40 tokens, L=16: boundaries below 40 are 0, 16, 32; 40 itself is no multiple of 16,
        # so an unfinished trajectory cannot be continued at its end either.
        (40, True, [0, 16, 32]),
        (40, False, [0, 16, 32]),
        # Exactly 2L: a finished trajectory has nothing after 32 to cut off; an unfinished
        # one ends on a boundary, so cutting at 32 continues it.
        (32, True, [0, 16]),
        (32, False, [0, 16, 32]),
        # Shorter than L: only the empty prefix, finished or not.
        (10, True, [0]),
        (10, False, [0]),
        # Zero tokens: nothing lies below 0; an unfinished empty trajectory ends on the
        # boundary 0 and may be continued from there.
        (0, True, []),
        (0, False, [0]),
    ],
)
def test_cut_points(length, finished, expected):
    assert cut_points(length, 16, finished=finished) == expected


# ------------------------------------------------------------ choose_reference


def _candidates() -> list[dict]:
    return [
        _traj("a", iteration=1, pv=1, finished=True, reward=1.0),
        _traj("b", iteration=3, pv=2, finished=True, reward=1.0),  # the latest success
        _traj("c", iteration=3, pv=1, finished=True, reward=1.0),  # same iteration as b, older policy
        _traj("d", iteration=4, pv=4, finished=False, reward=None),  # newer, but unfinished
        _traj("e", iteration=5, pv=5, finished=True, reward=0.5),  # newest, but below 1.0
        _traj("f", iteration=6, pv=6, finished=True, reward=None),  # finished without a reward
    ]


def test_choose_reference_takes_the_latest_success():
    # d, e and f are newer than b but do not qualify; b beats c on policy_version.
    trajs = _candidates()
    assert choose_reference(trajs, exclude=None, success_threshold=1.0) == "b"
    random.Random(0).shuffle(trajs)  # input order plays no part
    assert choose_reference(trajs, exclude=None, success_threshold=1.0) == "b"


def test_choose_reference_never_returns_the_excluded_trajectory():
    # b is the latest success but is the chunk's own source: next newest is c (iteration 3,
    # version 1), ahead of a (iteration 1).
    assert choose_reference(_candidates(), exclude="b", success_threshold=1.0) == "c"
    without_c = [t for t in _candidates() if t["trajectory_id"] != "c"]
    assert choose_reference(without_c, exclude="b", success_threshold=1.0) == "a"


def test_choose_reference_or_excluded_takes_the_excluded_trajectory_only_when_it_is_the_only_success():
    assert choose_reference(_candidates(), exclude="b", success_threshold=1.0, or_excluded=True) == "c"
    only_b = [t for t in _candidates() if t["trajectory_id"] in ("b", "d", "e", "f")]
    assert choose_reference(only_b, exclude="b", success_threshold=1.0) is None
    assert choose_reference(only_b, exclude="b", success_threshold=1.0, or_excluded=True) == "b"
    # a failed source is never a reference
    failed = [t for t in _candidates() if t["trajectory_id"] in ("d", "e", "f")]
    assert choose_reference(failed, exclude="e", success_threshold=1.0, or_excluded=True) is None


def test_choose_reference_threshold_decides_success():
    # At 0.5, e (iteration 5, reward 0.5) qualifies and is the newest finished one.
    assert choose_reference(_candidates(), exclude=None, success_threshold=0.5) == "e"
    assert choose_reference(_candidates(), exclude="e", success_threshold=0.5) == "b"


def test_choose_reference_breaks_full_ties_by_id():
    # Same iteration and version: the smaller id, so the choice does not depend on order.
    trajs = [
        _traj("y", iteration=2, pv=2, finished=True, reward=1.0),
        _traj("x", iteration=2, pv=2, finished=True, reward=1.0),
    ]
    assert choose_reference(trajs, exclude=None, success_threshold=1.0) == "x"


def test_choose_reference_none_when_nothing_qualifies():
    trajs = [t for t in _candidates() if t["trajectory_id"] in ("d", "e", "f")]
    assert choose_reference(trajs, exclude=None, success_threshold=1.0) is None
    only_b = [t for t in _candidates() if t["trajectory_id"] == "b"]
    assert choose_reference(only_b, exclude="b", success_threshold=1.0) is None
    assert choose_reference([], exclude=None, success_threshold=1.0) is None


def test_choose_reference_by_preference_takes_the_most_preferred_success_never_a_lucky_one():
    trajs = _candidates()  # successes a (iteration 1), b (3, the latest) and c (3)
    likelihood = {"a": -0.5, "b": -3.0, "c": -0.5}
    # the most preferred, not the latest: a and c tie, and the newer of the tie (c) wins
    assert choose_reference(trajs, exclude=None, success_threshold=1.0, preference=likelihood) == "c"
    assert choose_reference(trajs, exclude="c", success_threshold=1.0, preference=likelihood) == "a"
    # a lucky success is never shown, even where it is the only other one
    assert choose_reference(trajs, exclude="c", success_threshold=1.0, preference=likelihood, lucky={"b"}) == "a"
    assert choose_reference(trajs, exclude="c", success_threshold=1.0, lucky={"a", "b"}) is None
    # ... nor as the source itself under or_excluded; a source that is not lucky still may be
    kw = dict(success_threshold=1.0, or_excluded=True, preference=likelihood)
    assert choose_reference(trajs, exclude="b", lucky={"a", "b"}, **kw) == "c"
    assert choose_reference(trajs, exclude="c", lucky={"a", "b"}, **kw) == "c"
    assert choose_reference(trajs, exclude="c", lucky={"a", "b", "c"}, **kw) is None
    # the threshold still decides what a success is: e (reward 0.5) is never weighed at 1.0
    assert choose_reference(trajs, exclude=None, success_threshold=1.0, preference={**likelihood, "e": 0.0}) == "c"


def test_success_repeats_counts_the_whole_answers_that_wrote_each_success():
    a = _traj("a", iteration=1, pv=1, finished=True, reward=1.0)
    text = {"token_ids": a["token_ids"]}
    twice = [a, _traj("b", iteration=2, pv=2, finished=True, reward=1.0) | text]  # a's text written again, later
    once = _traj("c", iteration=3, pv=3, finished=True, reward=1.0)
    failed = _traj("d", iteration=2, pv=2, finished=True, reward=0.0) | text  # a's text, graded a failure
    unfinished = _traj("u", iteration=2, pv=2, finished=False, reward=None) | text  # a's text again, not finished
    continued = _traj("k", iteration=4, pv=4, finished=True, reward=1.0) | {
        "token_ids": once["token_ids"],
        "source_trajectory_id": "c",
    }
    repeats = success_repeats([*twice, once, failed, unfinished, continued], 1.0)
    # a, b and the failure d wrote one text; an unfinished answer and a continuation write none, and the success k,
    # a continuation, is weighed by the whole answers that wrote its tokens (c alone)
    assert repeats == {"a": 3, "b": 3, "c": 1, "k": 1}
    assert success_repeats([*twice, once], 1.5) == {}  # the threshold decides what a success is
    assert unrepeated_successes(repeats, 2) == {"c", "k"}
    assert unrepeated_successes(repeats, 1) == set()


def test_lucky_successes_are_those_below_the_floor():
    likelihood = {"a": -0.5, "b": -3.0, "c": -1.0}
    assert lucky_successes(likelihood, -1.0) == {"b"}  # at the floor is not below it
    assert lucky_successes(likelihood, 0.0) == {"a", "b", "c"}
    assert lucky_successes(likelihood, None) == set()


# ---------------------------------------------------------------- merge_replay


def test_merge_replay_keeps_the_newest_per_problem():
    replay = [
        _traj("p0-1", iteration=1, pv=1, finished=True, reward=0.0),
        _traj("p0-2", iteration=2, pv=2, finished=False, reward=None),
        _traj("p0-3", iteration=3, pv=3, finished=True, reward=1.0),
        _traj("p1-1", iteration=1, pv=1, finished=True, reward=1.0, problem="p1"),
    ]
    new = [_traj("p0-4", iteration=4, pv=4, finished=True, reward=1.0)]
    merged = merge_replay(replay, new, max_per_problem=3)
    # p0 now has 4 trajectories; keeping 3 drops the oldest (iteration 1). p1 keeps its one.
    # Rows come problem by problem, newest first.
    assert [t["trajectory_id"] for t in merged] == ["p0-4", "p0-3", "p0-2", "p1-1"]
    assert merged[0] == new[0]


def test_merge_replay_new_row_replaces_the_same_id():
    old = _traj("t", iteration=2, pv=2, finished=False, reward=None, n=16)
    rerun = _traj("t", iteration=2, pv=2, finished=True, reward=1.0, n=20)
    other = _traj("u", iteration=1, pv=1, finished=True, reward=0.0)
    merged = merge_replay([old, other], [rerun], max_per_problem=16)
    # One row per id, and it is the new one.
    assert [t["trajectory_id"] for t in merged] == ["t", "u"]
    assert merged[0] is rerun and merged[0]["finished"] and len(merged[0]["token_ids"]) == 20


def test_merge_replay_whole_first_keeps_whole_answers_ahead_of_newer_continuations():
    whole = [_traj(f"w{i}", iteration=i, pv=i, finished=True, reward=0.0) for i in (1, 2)]
    stitched = [
        _traj(f"c{i}", iteration=i, pv=i, finished=False, reward=None) | {"source_trajectory_id": "w2"} for i in (3, 4, 5)
    ]
    # by age alone the three newer continuations push both whole answers out
    assert [t["trajectory_id"] for t in merge_replay(whole, stitched, max_per_problem=3)] == ["c5", "c4", "c3"]
    # whole answers first, then the newest continuations in the slots left
    kept = merge_replay(whole, stitched, max_per_problem=3, whole_first=True)
    assert [t["trajectory_id"] for t in kept] == ["w2", "w1", "c5"]
    # a newer whole answer still evicts the oldest whole answer
    newer = [_traj(f"w{i}", iteration=i, pv=i, finished=True, reward=1.0) for i in (6, 7, 8)]
    assert [t["trajectory_id"] for t in merge_replay(kept, newer, max_per_problem=3, whole_first=True)] == ["w8", "w7", "w6"]


def test_merge_replay_with_nothing_new_only_trims():
    replay = [_traj(f"t{i}", iteration=i, pv=i, finished=True, reward=0.0) for i in range(5)]
    # Newest two of iterations 0..4 are 4 and 3.
    assert [t["trajectory_id"] for t in merge_replay(replay, [], max_per_problem=2)] == ["t4", "t3"]
    assert merge_replay([], [], max_per_problem=2) == []


# --------------------------------------------------------------- pick_problems

TRAIN = [f"p{i:02d}" for i in range(10)]


@pytest.mark.parametrize("seed", range(5))
def test_pick_problems_revisits_its_share_of_replayed_problems(seed):
    # n=4, revisit_fraction=0.5: round(4 * 0.5) = 2 revisits; exactly two train problems
    # have replay (x is not a train problem), so both are always drawn, and 2 more from the rest.
    chosen = pick_problems(TRAIN, {"p01", "p03", "x"}, n=4, revisit_fraction=0.5, rng=np.random.default_rng(seed))
    assert len(chosen) == 4 and len(set(chosen)) == 4
    assert chosen == sorted(chosen)
    assert {"p01", "p03"} <= set(chosen)
    assert set(chosen) <= set(TRAIN)


@pytest.mark.parametrize("seed", range(5))
def test_pick_problems_all_from_replay_when_fraction_is_one(seed):
    # revisit_fraction=1 and 6 replayed problems: all round(4 * 1) = 4 draws come from them.
    replayed = {"p00", "p02", "p04", "p06", "p08", "p09"}
    chosen = pick_problems(TRAIN, replayed, n=4, revisit_fraction=1.0, rng=np.random.default_rng(seed))
    assert len(set(chosen)) == 4 and set(chosen) <= replayed


def test_pick_problems_revisits_capped_by_what_has_replay():
    # Asked for round(6 * 0.5) = 3 revisits but only p05 has replay: it is drawn, plus 5 others.
    for seed in range(5):
        chosen = pick_problems(TRAIN, {"p05"}, n=6, revisit_fraction=0.5, rng=np.random.default_rng(seed))
        assert len(set(chosen)) == 6 and "p05" in chosen


def test_pick_problems_never_more_than_the_train_set():
    assert pick_problems(TRAIN[:3], {"p00"}, n=8, revisit_fraction=0.5, rng=np.random.default_rng(0)) == TRAIN[:3]


def test_pick_problems_is_deterministic_per_seed():
    def draw(seed):
        return pick_problems(TRAIN, {"p01", "p02", "p03"}, n=4, revisit_fraction=0.25, rng=np.random.default_rng(seed))

    assert draw(7) == draw(7)
    assert len({tuple(draw(s)) for s in range(8)}) > 1  # the seed does matter


def test_pick_problems_refuses_an_empty_train_set():
    with pytest.raises(ValueError, match="no training problems"):
        pick_problems([], {"p0"}, n=4, revisit_fraction=0.5, rng=np.random.default_rng(0))


# --------------------------------------------------------------- plan_prefixes

L, MAX = 16, 40


def _plan(trajs, *, chunk_mode=True, k=2, seed=0, max_response_tokens=MAX):
    return plan_prefixes(
        "p0",
        trajs,
        chunk_mode=chunk_mode,
        k=k,
        chunk_tokens=L,
        max_response_tokens=max_response_tokens,
        rng=np.random.default_rng(seed),
    )


def _replay() -> list[dict]:
    return [
        # 48 tokens, unfinished: cuts 0, 16, 32, 48; 48 >= MAX=40 is dropped.
        _traj("u", iteration=2, pv=2, finished=False, reward=None, n=48),
        # 20 tokens, finished: cuts 0, 16.
        _traj("f", iteration=1, pv=1, finished=True, reward=1.0, n=20),
    ]


def test_plan_prefixes_full_mode_is_one_empty_prefix_with_the_whole_budget():
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    plan = plan_prefixes("p0", _replay(), chunk_mode=False, k=2, chunk_tokens=L, max_response_tokens=MAX, rng=rng)
    assert plan == [PlannedPrefix("p0", "full", None, [], MAX)]
    assert rng.bit_generator.state == before  # full mode draws nothing


def test_plan_prefixes_chunk_mode_lists_every_boundary_when_k_allows():
    trajs = _replay()
    plan = _plan(trajs, k=100)
    tokens = {t["trajectory_id"]: t["token_ids"] for t in trajs}
    # (source, cut, budget): budget = min(L, MAX - cut), so the cut at 32 gets 40 - 32 = 8.
    assert sorted((p.source_trajectory_id, len(p.prefix_token_ids), p.budget) for p in plan) == [
        ("f", 0, 16),
        ("f", 16, 16),
        ("u", 0, 16),
        ("u", 16, 16),
        ("u", 32, 8),
    ]
    for p in plan:
        assert p.problem_id == "p0" and p.mode == "chunk"
        assert p.prefix_token_ids == tokens[p.source_trajectory_id][: len(p.prefix_token_ids)]


@pytest.mark.parametrize("seed", range(5))
def test_plan_prefixes_chunk_mode_draws_at_most_k_distinct_cuts(seed):
    trajs = _replay()
    tokens = {t["trajectory_id"]: t["token_ids"] for t in trajs}
    plan = _plan(trajs, k=2, seed=seed)
    assert len(plan) == 2
    cuts = {(p.source_trajectory_id, len(p.prefix_token_ids)) for p in plan}
    assert len(cuts) == 2  # drawn without replacement
    for p in plan:
        cut = len(p.prefix_token_ids)
        assert p.mode == "chunk" and cut % L == 0 and cut < MAX
        assert p.prefix_token_ids == tokens[p.source_trajectory_id][:cut]
        assert p.budget == min(L, MAX - cut)


def test_plan_prefixes_is_deterministic_per_seed():
    assert _plan(_replay(), seed=3) == _plan(_replay(), seed=3)
    assert len({tuple((p.source_trajectory_id, len(p.prefix_token_ids)) for p in _plan(_replay(), seed=s)) for s in range(8)}) > 1


def test_plan_prefixes_falls_back_to_full_mode_without_candidates():
    full = [PlannedPrefix("p0", "full", None, [], MAX)]
    assert _plan([]) == full
    # A finished empty trajectory has no cut points (see cut_points), so no candidates.
    assert _plan([_traj("z", iteration=1, pv=1, finished=True, reward=0.0, n=0)]) == full


# ------------------------------------------------------------------ solved_recently


def _group(iteration: int, rewards: list[float | None], *, chunk: bool = False) -> list[dict]:
    out = []
    for i, r in enumerate(rewards):
        t = _traj(f"t{iteration}-{i}", iteration=iteration, pv=iteration, finished=r is not None, reward=r)
        if chunk:
            t["source_trajectory_id"] = "src"
        out.append(t)
    return out


def test_solved_recently_needs_every_sample_of_the_last_groups_solved():
    solved_twice = _group(3, [1.0, 1.0]) + _group(5, [1.0, 1.0])
    assert solved_recently(solved_twice, groups=2, success_threshold=1.0)
    # one failure in the newest group, or a failure in the second newest, is enough to keep it
    assert not solved_recently(_group(3, [1.0, 1.0]) + _group(5, [1.0, 0.0]), groups=2, success_threshold=1.0)
    assert not solved_recently(_group(3, [0.0, 1.0]) + _group(5, [1.0, 1.0]), groups=2, success_threshold=1.0)
    # an old failure outside the last two groups does not count
    assert solved_recently(_group(1, [0.0]) + solved_twice, groups=2, success_threshold=1.0)


def test_solved_recently_counts_only_finished_full_groups():
    # only one full group so far: not enough evidence for groups=2
    assert not solved_recently(_group(5, [1.0, 1.0]), groups=2, success_threshold=1.0)
    # a successful chunk continuation is not a solve from scratch
    assert not solved_recently(_group(4, [1.0, 1.0], chunk=True) + _group(5, [1.0]), groups=2, success_threshold=1.0)
    # partial (unfinished) trajectories carry no reward and are ignored
    assert solved_recently(_group(4, [1.0, None]) + _group(5, [1.0]), groups=2, success_threshold=1.0)
    # the threshold decides what solved means
    assert not solved_recently(_group(4, [0.9]) + _group(5, [1.0]), groups=2, success_threshold=1.0)
    assert solved_recently(_group(4, [0.9]) + _group(5, [1.0]), groups=2, success_threshold=0.8)


def test_whole_answer_rate_is_the_smoothed_success_of_graded_whole_answers_only():
    assert whole_answer_rate([]) is None
    assert whole_answer_rate(_group(4, [1.0, 0.0, 0.0])) == pytest.approx(1.5 / 4)
    # never 0 or 1, so a scale of sqrt(b (1 - b)) stays finite
    assert whole_answer_rate(_group(4, [1.0, 1.0])) == pytest.approx(2.5 / 3)
    assert whole_answer_rate(_group(4, [0.0])) == pytest.approx(0.25)
    # a continuation's outcome is its state's, and an unfinished or ungraded answer has none
    mixed = _group(4, [0.0]) + _group(5, [1.0, 1.0], chunk=True) + _group(6, [None])
    assert whole_answer_rate(mixed) == pytest.approx(0.25)
    assert whole_answer_rate(_group(5, [1.0], chunk=True)) is None


def test_plan_prefixes_from_successes_cuts_only_what_succeeded_when_anything_did():
    failed = _traj("x", iteration=3, pv=3, finished=True, reward=0.0, n=36)
    trajs = [*_replay(), failed]
    kw = dict(chunk_mode=True, k=100, chunk_tokens=L, max_response_tokens=MAX, rng=np.random.default_rng(0))
    every = plan_prefixes("p0", trajs, **kw)
    assert {p.source_trajectory_id for p in every} == {"u", "f", "x"}
    live = plan_prefixes("p0", trajs, **kw, success_threshold=1.0)
    assert sorted((p.source_trajectory_id, len(p.prefix_token_ids)) for p in live) == [("f", 0), ("f", 16)]
    # nothing succeeded (at this threshold): every trajectory is cut from, as without the option
    none = plan_prefixes("p0", trajs, **{**kw, "rng": np.random.default_rng(0)}, success_threshold=1.5)
    assert {p.source_trajectory_id for p in none} == {"u", "f", "x"}


def test_plan_prefixes_from_successes_passes_over_lucky_ones():
    trajs = [*_replay(), _traj("x", iteration=3, pv=3, finished=True, reward=0.0, n=36)]
    kw = dict(chunk_mode=True, k=100, chunk_tokens=L, max_response_tokens=MAX, success_threshold=1.0)
    assert {p.source_trajectory_id for p in plan_prefixes("p0", trajs, **kw, rng=np.random.default_rng(0))} == {"f"}
    # f, the only success, is lucky: a failure-tolerant plan cuts from every trajectory, as with no success at all
    lucky = plan_prefixes("p0", trajs, **kw, rng=np.random.default_rng(0), lucky={"f"})
    assert {p.source_trajectory_id for p in lucky} == {"u", "f", "x"}
    # ... and a plan from successes alone gives the problem a fresh whole answer
    only = plan_prefixes("p0", trajs, **kw, rng=np.random.default_rng(0), lucky={"f"}, only_successes=True)
    assert only == [PlannedPrefix("p0", "full", None, [], MAX)]


def test_plan_prefixes_since_an_iteration_cuts_only_recent_whole_answers():
    stitched = _traj("s", iteration=5, pv=5, finished=False, reward=None, n=32) | {"source_trajectory_id": "f"}
    recent = _traj("r", iteration=4, pv=4, finished=True, reward=0.0, n=20)
    trajs = [*_replay(), stitched, recent]  # _replay's "u" is from iteration 2, "f" from 1
    kw = dict(chunk_mode=True, k=100, chunk_tokens=L, max_response_tokens=MAX, rng=np.random.default_rng(0))
    assert {p.source_trajectory_id for p in plan_prefixes("p0", trajs, **kw)} == {"u", "f", "s", "r"}
    assert {p.source_trajectory_id for p in plan_prefixes("p0", trajs, **kw, since_iteration=2)} == {"u", "r"}
    assert {p.source_trajectory_id for p in plan_prefixes("p0", trajs, **kw, since_iteration=3)} == {"r"}
    # nothing recent enough (the stitched continuation does not count): a fresh full answer instead
    assert plan_prefixes("p0", trajs, **kw, since_iteration=5) == [PlannedPrefix("p0", "full", None, [], MAX)]


def test_least_likely_cuts_orders_by_log_prob_below_the_limit_with_ties_to_the_earlier():
    logprobs = [-0.1, -2.0, -0.5, -2.0, -9.0, -0.2]
    # by (log-prob, position): -9.0 at 4, -2.0 at 1 and 3 (the tie: 1 first), -0.5 at 2, -0.2 at 5, -0.1 at 0
    assert least_likely_cuts(logprobs, limit=6, n=3) == [4, 1, 3]
    assert least_likely_cuts(logprobs, limit=4, n=3) == [1, 3, 2]  # position 4 is past the limit
    assert least_likely_cuts(logprobs, limit=99, n=10) == [4, 1, 3, 2, 5, 0]  # no more cuts than tokens
    assert least_likely_cuts([], limit=4, n=1) == []


def test_highest_entropy_cuts_orders_by_entropy_below_the_limit_with_ties_to_the_earlier():
    entropies = [0.05, 0.7, 0.1, 0.7, 1.9, 0.0]
    # by (-entropy, position): 1.9 at 4, 0.7 at 1 and 3 (the tie: 1 first), 0.1 at 2, 0.05 at 0, 0.0 at 5
    assert highest_entropy_cuts(entropies, limit=6, n=3) == [4, 1, 3]
    assert highest_entropy_cuts(entropies, limit=4, n=3) == [1, 3, 2]  # position 4 is past the limit
    assert highest_entropy_cuts(entropies, limit=99, n=10) == [4, 1, 3, 2, 0, 5]  # no more cuts than tokens
    assert highest_entropy_cuts([], limit=4, n=1) == []
