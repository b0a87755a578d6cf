"""critic.replay_iterations: update_critic also fits the answers replay holds from recent iterations."""

from __future__ import annotations

from ac2_core.stages.update_critic import recent_answers
from tests.conftest import tiny_config


def _replay(*rows: tuple) -> list[dict]:
    """Replay rows from (id, problem, iteration, reward, finished, length); each answer's tokens are its own."""
    return [
        {
            "trajectory_id": tid,
            "problem_id": pid,
            "iteration": it,
            "policy_version": it,
            "token_ids": [k] * n,
            "finished": done,
            "reward": reward,
        }
        for k, (tid, pid, it, reward, done, n) in enumerate(rows)
    ]


def test_recent_answers_are_the_finished_graded_ones_of_the_window_each_with_another_success_as_reference():
    cfg = tiny_config(critic__replay_iterations=2, rollout__chunk_tokens=16, replay__success_threshold=1.0)
    replay = _replay(
        ("a-old", "a", 7, 1.0, True, 40),  # before the window
        ("a-won", "a", 8, 1.0, True, 40),
        ("a-lost", "a", 9, 0.0, True, 40),
        ("a-open", "a", 9, None, False, 40),  # unfinished: no outcome
        ("a-ungraded", "a", 9, None, True, 40),  # finished but not graded
        ("b-won", "b", 9, 1.0, True, 20),  # the problem's only success
        ("b-now", "b", 10, 0.0, True, 40),  # this iteration's: its pairs are fitted already
    )
    tid_of = {tuple(r["token_ids"]): r["trajectory_id"] for r in replay}
    got = {
        tid_of[tuple(tokens)]: (pid, ref, outcome, cuts) for pid, ref, tokens, outcome, cuts in recent_answers(cfg, replay, 10)
    }
    assert set(got) == {"a-won", "a-lost", "b-won"}
    # the reference is the problem's latest success other than the answer itself, in the window or not
    assert got["a-won"] == ("a", "a-old", 1.0, [0, 16, 32])
    assert got["a-lost"] == ("a", "a-won", 0.0, [0, 16, 32])
    assert got["b-won"] == ("b", None, 1.0, [0, 16])  # no answer is shown itself


def test_without_a_window_the_critic_fits_this_iterations_answers_alone():
    cfg = tiny_config()
    assert cfg.critic.replay_iterations == 0
    assert recent_answers(cfg, _replay(("a", "a", 9, 1.0, True, 8)), 10) == []


def test_without_references_none_is_shown():
    cfg = tiny_config(critic__replay_iterations=1, critic__use_reference=False)
    replay = _replay(("a-won", "a", 9, 1.0, True, 8), ("a-lost", "a", 9, 0.0, True, 8))
    assert [ref for _, ref, *_ in recent_answers(cfg, replay, 10)] == [None, None]
