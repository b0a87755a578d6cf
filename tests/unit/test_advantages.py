"""Hand-computed checks of ac2_core.math.advantages."""

import math

import pytest
import torch
from torch.testing import assert_close

from ac2_core.math.advantages import critic_credit, gate_weights, group_advantages, grpo_advantages, replay_rate_advantages


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def ids(*values):
    return torch.tensor(values, dtype=torch.int64)


def test_loo_baseline_one_group():
    adv, base = group_advantages(t(1, 0, 0), ids(7, 7, 7))
    # loo for group [1, 0, 0]: b_0 = (0+0)/2 = 0 -> A_0 = 1;
    # b_1 = (1+0)/2 = 0.5 -> A_1 = -0.5; b_2 = (1+0)/2 = 0.5 -> A_2 = -0.5
    assert_close(base, t(0, 0.5, 0.5))
    assert_close(adv, t(1, -0.5, -0.5))


def test_loo_non_contiguous_unsorted_ids():
    # group 42 = rows 0, 2, 4 with targets [1, 0.5, 0]; group 3 = rows 1, 3 with [0, 1]
    adv, base = group_advantages(t(1, 0, 0.5, 1, 0), ids(42, 3, 42, 3, 42))
    # row 0: b = (0.5+0)/2 = 0.25 -> A = 0.75;  row 2: b = (1+0)/2 = 0.5 -> A = 0
    # row 4: b = (1+0.5)/2 = 0.75 -> A = -0.75; row 1: b = 1 -> A = -1; row 3: b = 0 -> A = 1
    assert_close(base, t(0.25, 1, 0.5, 0, 0.75))
    assert_close(adv, t(0.75, -1, 0, 1, -0.75))


def test_loo_singleton_group_has_zero_advantage():
    adv, base = group_advantages(t(1, 1, 0), ids(5, 9, 9))
    # row 0 is alone: b = its own target 1 -> A = 0; group 9 = [1, 0]: A = 1 - 0, 0 - 1
    assert_close(base, t(1, 0, 1))
    assert_close(adv, t(0, 1, -1))


def test_mean_baseline():
    adv, base = group_advantages(t(1, 0, 0, 1), ids(0, 0, 0, 1), baseline="mean")
    # group 0 = [1, 0, 0]: mean 1/3 -> A = [2/3, -1/3, -1/3]; group 1 = [1]: mean 1 -> A = 0
    assert_close(base, t(1 / 3, 1 / 3, 1 / 3, 1))
    assert_close(adv, t(2 / 3, -1 / 3, -1 / 3, 0))


def test_critic_baseline_uses_values_start():
    values = t(0.6, 0.6, 0.5)
    adv, base = group_advantages(t(1, 0, 0.7), ids(0, 0, 1), baseline="critic", values_start=values)
    # A = y - V(x, s): 1 - 0.6 = 0.4; 0 - 0.6 = -0.6; 0.7 - 0.5 = 0.2
    assert_close(base, values)
    assert_close(adv, t(0.4, -0.6, 0.2))


def test_critic_baseline_without_values_start_names_it():
    with pytest.raises(ValueError, match="values_start"):
        group_advantages(t(1, 0), ids(0, 0), baseline="critic")


def test_unknown_baseline_names_it_and_the_choices():
    with pytest.raises(ValueError, match=r"baseline must be one of \('loo', 'mean', 'critic'\); got 'median'"):
        group_advantages(t(1, 0), ids(0, 0), baseline="median")


def test_std_scaling_two_sample_group_gives_plus_minus_one():
    adv, _ = group_advantages(t(1, 0), ids(0, 0), baseline="mean", scale_std=True, eps=0.0)
    # mean 0.5, population std sqrt(((0.5)^2 + (0.5)^2)/2) = 0.5 -> A = ±0.5 / 0.5 = ±1
    assert_close(adv, t(1, -1))


def test_std_scaling_with_loo_baseline():
    adv, base = group_advantages(t(1, 0, 0), ids(0, 0, 0), scale_std=True, eps=0.0)
    # loo A = [1, -0.5, -0.5] (see above); population std of [1, 0, 0]:
    # mean 1/3, var = ((2/3)^2 + 2*(1/3)^2)/3 = (6/9)/3 = 2/9 -> std = sqrt(2)/3
    # A = [1, -0.5, -0.5] * 3/sqrt(2) = [3/sqrt(2), -1.5/sqrt(2), -1.5/sqrt(2)]
    r2 = math.sqrt(2)
    assert_close(adv, t(3 / r2, -1.5 / r2, -1.5 / r2))
    assert_close(base, t(0, 0.5, 0.5))  # the baseline itself is not scaled


def test_std_floor_bounds_the_amplification_of_near_equal_targets():
    targets, groups = t(0.50, 0.48, 0.9, 0.1), ids(0, 0, 1, 1)
    adv, _ = group_advantages(targets, groups, baseline="mean", scale_std=True, std_floor=0.1, eps=0.0)
    # group 0: mean 0.49, A = ±0.01, std 0.01 is below the floor -> ±0.01 / 0.1 = ±0.1 (unfloored: ±1)
    # group 1: mean 0.5, A = ±0.4, std 0.4 is above the floor -> ±1
    assert_close(adv, t(0.1, -0.1, 1, -1))


def test_std_scaling_constant_group_is_zero_not_nan():
    adv, _ = group_advantages(t(1, 1), ids(0, 0), baseline="mean", scale_std=True)
    # A = 0 / (std 0 + eps) = 0
    assert_close(adv, t(0, 0))


def test_grpo_advantages_group_normalized():
    adv, base = grpo_advantages(t(1, 0, 0, 0, 1, 0), ids(8, 8, 8, 8, 3, 3), eps=0.0)
    # group 8 = [1, 0, 0, 0]: mean 1/4, population std sqrt(1/4 * 3/4) = sqrt(3)/4
    #   A_0 = (3/4) / (sqrt(3)/4) = sqrt(3); A_rest = (-1/4) / (sqrt(3)/4) = -1/sqrt(3)
    # group 3 = [1, 0]: mean 0.5, std 0.5 -> A = ±1
    r3 = math.sqrt(3)
    assert_close(adv, t(r3, -1 / r3, -1 / r3, -1 / r3, 1, -1))
    assert_close(base, t(0.25, 0.25, 0.25, 0.25, 0.5, 0.5))  # the group means


def test_grpo_advantages_without_std_scaling():
    adv, _ = grpo_advantages(t(1, 0, 0, 0), ids(1, 1, 1, 1), scale_std=False)
    # mean 1/4 -> A = [0.75, -0.25, -0.25, -0.25]
    assert_close(adv, t(0.75, -0.25, -0.25, -0.25))


def test_replay_rate_advantages_measure_one_answer_against_its_problems_rate():
    rewards, rates = t(1, 0, 1), t(0.25, 0.25, 0.9)
    assert_close(replay_rate_advantages(rewards, rates, scale_std=False), t(0.75, -0.25, 0.1))
    # scaled by the std a group's rewards would have at that rate: at b = 1/4 a success is the
    # sqrt(3) and a failure the -1/sqrt(3) that GRPO gives a [1, 0, 0, 0] group
    r3 = math.sqrt(3)
    assert_close(replay_rate_advantages(rewards, rates), t(r3, -1 / r3, 0.1 / 0.3))
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        replay_rate_advantages(t(1), t(1.0))
    with pytest.raises(ValueError, match=r"both be \(B,\)"):
        replay_rate_advantages(t(1, 0), t(0.5))


def test_gate_weights():
    from_critic = torch.tensor([True, False, True, False])
    ready = torch.tensor([False, False, True, True])
    w = gate_weights(from_critic, ready)
    # row 0: critic target on a non-ready problem -> 0
    # row 1: reward target on a non-ready problem -> kept
    # row 2: critic target on a ready problem -> kept; row 3: reward target, ready -> kept
    assert w.dtype == torch.float32
    assert_close(w, t(0, 1, 1, 1))


def test_critic_credit_gives_each_segment_the_change_in_value_it_brought():
    # 37 tokens in segments of 16: 16, 16, 5; the answer slipped in its second segment
    credit = critic_credit([0.4, 0.6, 0.0], 0.0, 37, 16)
    assert credit == pytest.approx([0.2] * 16 + [-0.6] * 16 + [0.0] * 5)
    # the segments telescope to R - V(s_0), whatever the values between
    values = [0.1, 0.9, 0.35, 0.7]
    per_segment = critic_credit(values, 1.0, 64, 16)[::16]
    assert sum(per_segment) == pytest.approx(1.0 - 0.1)
    assert critic_credit([0.25], 1.0, 3, 16) == pytest.approx([0.75] * 3)
    for values, length in (([0.5, 0.5], 16), ([0.5], 17), ([], 1)):
        with pytest.raises(ValueError, match="needs"):
            critic_credit(values, 1.0, length, 16)
    with pytest.raises(ValueError, match="length and chunk_tokens must be >= 1"):
        critic_credit([0.5], 1.0, 0, 16)


def test_critic_credit_with_lambda_hands_each_segment_a_discounted_share_of_the_later_changes():
    # changes along [0.4, 0.6, 0.0] -> R = 0: delta = 0.2, -0.6, 0.0 (segments of 16, 16, 5)
    # lam 0.5: A_2 = 0.0; A_1 = -0.6 + 0.5 * 0.0 = -0.6; A_0 = 0.2 + 0.5 * -0.6 = -0.1
    half = critic_credit([0.4, 0.6, 0.0], 0.0, 37, 16, lam=0.5)
    assert half == pytest.approx([-0.1] * 16 + [-0.6] * 16 + [0.0] * 5)
    # lam 1: every segment R - V(s_j), the value where it began against the outcome
    values = [0.1, 0.9, 0.35, 0.7]
    assert critic_credit(values, 1.0, 64, 16, lam=1.0)[::16] == pytest.approx([0.9, 0.1, 0.65, 0.3])
    # a flat critic then gives every token the outcome against one baseline; at lam 0 only the last segment
    assert set(critic_credit([0.5] * 4, 0.0, 64, 16, lam=1.0)) == {-0.5}
    assert critic_credit([0.5] * 4, 0.0, 64, 16)[::16] == pytest.approx([0.0, 0.0, 0.0, -0.5])
    for lam in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"lam must be in \[0, 1\]; got"):
            critic_credit(values, 1.0, 64, 16, lam=lam)
