"""The diagnostic oracle critic (arith): hand-computed depth rates and values."""

import pytest

from ac2_core.config import ConfigError
from ac2_core.stages.oracle_critic import chunk_group_class, depth_rates, oracle_value
from tests.conftest import tiny_config

SOLUTION = "1+2=3;3+4=7;#7"


def test_depth_rates_count_answers_while_they_agree():
    answers = [
        (SOLUTION, "1+2=3;3+4=7;#7", 1.0),  # agrees to the end: a state at every depth 0..13
        (SOLUTION, "1+2=4;4+4=8;#8", 0.0),  # leaves the solution at depth 4 ('4' for '3'): states 0..4
        (SOLUTION, "1+2=3;3+4=7;#7", 1.0),
    ]
    depths, rates = depth_rates(answers)
    assert depths == list(range(14))
    # depths 0..4 (one answer's state at depth 4 is already off-track? no: the state of depth 4
    # is "1+2=", still on the solution; its next token is the error): 3 answers, 2 successes
    assert rates[0] == rates[4] == pytest.approx((2 + 1) / (3 + 2))
    # depth 5 on: only the two correct answers -> (2 + 1) / (2 + 2)
    assert rates[5] == rates[13] == pytest.approx(3 / 4)


def test_oracle_value_is_zero_off_the_solution_and_the_depth_rate_on_it():
    depths, rates = [0, 4, 8], [0.2, 0.4, 0.8]
    assert oracle_value(SOLUTION, "1+2=4", depths, rates) == 0.0  # an error is written
    assert oracle_value(SOLUTION, "", depths, rates) == 0.2
    assert oracle_value(SOLUTION, "1+2=3;", depths, rates) == 0.4  # depth 6: deepest measured depth <= 6 is 4
    assert oracle_value(SOLUTION, "1+2=3;3+4=7", depths, rates) == 0.8
    assert oracle_value(SOLUTION, "1+2=3;", [], []) == 0.5  # nothing measured yet


def test_the_oracle_is_only_for_arith():
    assert tiny_config(critic__kind="oracle").critic.kind == "oracle"
    with pytest.raises(ConfigError, match="critic.kind: .*only task arith has.*found task math"):
        tiny_config(critic__kind="oracle", task__name="math", task__shape="final_answer", task__data="/nonexistent.jsonl")


def test_a_chunk_group_is_off_prefix_mixed_or_agreeing_as_the_oracle_sees_it():
    on, off = ("1+2=3;3+", False, None), ("1+2=3;4+", False, None)  # unfinished: judged by the text
    won, lucky_loss = (SOLUTION, True, 1.0), ("1+2=3;3+4=7;#7", True, 0.0)  # finished: judged by the reward
    assert chunk_group_class(SOLUTION, "1+2=4", [on, on], 1.0) == "off_prefix"  # whatever follows
    assert chunk_group_class(SOLUTION, "1+2=3;", [on, off, on], 1.0) == "mixed"
    assert chunk_group_class(SOLUTION, "1+2=3;", [off, off], 1.0) == "agreeing"
    assert chunk_group_class(SOLUTION, "", [on, won, on], 1.0) == "agreeing"
    assert chunk_group_class(SOLUTION, "", [on, lucky_loss], 1.0) == "mixed"  # on the text, but its reward failed


def test_the_oracle_hybrids_are_for_arith_and_replace_a_learned_critic_only():
    assert tiny_config(critic__oracle_groups=["mixed"]).critic.oracle_groups == ["mixed"]
    with pytest.raises(ConfigError, match="critic.oracle_groups reads the canonical worked solution"):
        math = {"task__name": "math", "task__shape": "final_answer", "task__data": "/nonexistent.jsonl"}
        tiny_config(critic__oracle_groups=["mixed"], **math)
    with pytest.raises(ConfigError, match="critic.kind oracle has no learned values to replace"):
        tiny_config(critic__kind="oracle", critic__oracle_from_iteration=3)
    with pytest.raises(ConfigError, match="oracle_groups"):
        tiny_config(critic__oracle_groups=["stale"])
