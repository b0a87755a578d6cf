"""Hand-computed checks of ac2_core.math.losses."""

import math

import pytest
import torch
from torch.testing import assert_close

from ac2_core.math.losses import critic_bce_loss, ppo_clip_loss


def ratios_to_logprobs(rows):
    """logprobs = log(ratio) with old_logprobs = 0, so exp(lp - old) = ratio."""
    lp = torch.log(torch.tensor(rows, dtype=torch.float32)).requires_grad_(True)
    return lp, torch.zeros_like(lp)


def scalar(x):
    return torch.tensor(x, dtype=torch.float32)


def one_token_loss(ratio, advantage, **kwargs):
    lp, old = ratios_to_logprobs([[ratio]])
    loss, stats = ppo_clip_loss(lp, old, torch.tensor([advantage]), torch.ones(1, 1), **kwargs)
    return loss, stats


@pytest.mark.parametrize(
    ("ratio", "advantage", "expected", "clipped"),
    [
        # A > 0, ratio above 1 + 0.28: -min(1.5*1, 1.28*1) = -1.28, clipped
        (1.5, 1.0, -1.28, 1.0),
        # A < 0, ratio below 1 - 0.2: -min(0.5*-1, 0.8*-1) = -min(-0.5, -0.8) = 0.8, clipped
        (0.5, -1.0, 0.8, 1.0),
        # A > 0, ratio inside [0.8, 1.28]: -min(1.1, 1.1) = -1.1, not clipped
        (1.1, 1.0, -1.1, 0.0),
        # A > 0, ratio below 0.8: -min(0.5, 0.8) = -0.5; the unclipped branch is active
        (0.5, 1.0, -0.5, 0.0),
        # A < 0, ratio above 1.28: -min(-1.5, -1.28) = 1.5; the unclipped branch is active
        (1.5, -1.0, 1.5, 0.0),
    ],
)
def test_ppo_clip_each_side(ratio, advantage, expected, clipped):
    loss, stats = one_token_loss(ratio, advantage)
    assert_close(loss, scalar(expected))
    assert stats["clip_fraction"] == clipped


def test_ppo_separate_low_and_high_clips():
    # ratio 1.25, A = 1: inside 1 + 0.28 -> -1.25; with clip_high = 0.2 -> -min(1.25, 1.2) = -1.2
    assert_close(one_token_loss(1.25, 1.0, clip_high=0.28)[0], scalar(-1.25))
    assert_close(one_token_loss(1.25, 1.0, clip_high=0.2)[0], scalar(-1.2))
    # ratio 0.75, A = -1: clip_low = 0.2 -> -min(-0.75, -0.8) = 0.8; clip_low = 0.3 -> 0.75
    assert_close(one_token_loss(0.75, -1.0, clip_low=0.2)[0], scalar(0.8))
    assert_close(one_token_loss(0.75, -1.0, clip_low=0.3)[0], scalar(0.75))


def test_ppo_batch_loss_stats_and_gradient():
    lp, old = ratios_to_logprobs([[1.5, 1.1], [0.5, 1.5]])
    adv = torch.tensor([1.0, -1.0])
    loss, stats = ppo_clip_loss(lp, old, adv, torch.ones(2, 2))
    # per token: row 0 (A=1): -1.28 (clipped), -1.1; row 1 (A=-1): 0.8 (clipped), 1.5
    # mean = (-1.28 - 1.1 + 0.8 + 1.5) / 4 = -0.08 / 4 = -0.02
    assert_close(loss, scalar(-0.02))
    assert stats["clip_fraction"] == 0.5  # 2 of 4 tokens
    # ratio_mean = (1.5 + 1.1 + 0.5 + 1.5) / 4 = 1.15
    assert stats["ratio_mean"] == pytest.approx(1.15, rel=1e-6)
    # approx_kl = mean(r - 1 - ln r): 1.5 -> 0.5 - 0.405465 = 0.094535; 1.1 -> 0.1 - 0.095310
    # = 0.004690; 0.5 -> -0.5 + 0.693147 = 0.193147; 1.5 -> 0.094535; sum 0.386907 / 4
    assert stats["approx_kl"] == pytest.approx(0.0967267, rel=1e-4)
    loss.backward()
    # clipped tokens get no gradient; unclipped: d(-r*A/4)/d lp = -r*A/4
    # row 0 tok 1: -1.1/4 = -0.275; row 1 tok 1: 1.5/4 = 0.375
    assert_close(lp.grad, torch.tensor([[0.0, -0.275], [0.0, 0.375]]))


def test_ppo_mask_excludes_tokens_bool_or_float():
    lp, old = ratios_to_logprobs([[1.1, 0.9, 5.0]])
    adv = torch.tensor([1.0])
    for mask in (torch.tensor([[True, True, False]]), torch.tensor([[1.0, 1.0, 0.0]])):
        loss, stats = ppo_clip_loss(lp, old, adv, mask)
        # only tokens 0, 1 count: -(1.1 + 0.9) / 2 = -1.0; the masked 5.0 would be clipped
        assert_close(loss, scalar(-1.0))
        assert stats["clip_fraction"] == 0.0


def test_ppo_global_normalizer_makes_micro_batches_sum_to_full_loss():
    lp, old = ratios_to_logprobs([[1.1, 0.9, 1.0], [1.1, 0.9, 1.0]])
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    full, _ = ppo_clip_loss(lp, old, adv, mask)
    # row 0 (A=1): -(1.1 + 0.9) = -2.0; row 1 (A=-1): 1.1 + 0.9 + 1.0 = 3.0; 5 tokens
    # full = (-2.0 + 3.0) / 5 = 0.2
    assert_close(full, scalar(0.2))
    halves = [ppo_clip_loss(lp[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1], normalizer=5)[0] for i in (0, 1)]
    # -2.0 / 5 = -0.4 and 3.0 / 5 = 0.6, summing to 0.2 (each half's own mean would be -1 and 1)
    assert_close(halves[0], scalar(-0.4))
    assert_close(halves[1], scalar(0.6))
    assert_close(halves[0] + halves[1], full)


def test_ppo_kl_term_k3():
    lp = torch.zeros(1, 2)
    ref = torch.tensor([[math.log(2.0), -math.log(2.0)]])
    # ratio 1 and A = 0, so only the KL term remains; k3(d) = e^d - d - 1 with d = ref - lp:
    # d = ln 2 -> 2 - ln 2 - 1; d = -ln 2 -> 0.5 + ln 2 - 1; the sum is 0.5
    # loss = 0.1 * 0.5 / 2 tokens = 0.025
    loss, _ = ppo_clip_loss(lp, lp, torch.zeros(1), torch.ones(1, 2), ref_logprobs=ref, kl_beta=0.1)
    assert_close(loss, scalar(0.025))
    # kl_beta = 0 ignores the reference
    loss, _ = ppo_clip_loss(lp, lp, torch.zeros(1), torch.ones(1, 2), ref_logprobs=ref)
    assert_close(loss, scalar(0.0))


def test_ppo_kl_without_reference_raises():
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="ref_logprobs"):
        ppo_clip_loss(lp, lp, torch.zeros(1), torch.ones(1, 2), kl_beta=0.1)


def test_ppo_advantages_shape_checked():
    lp = torch.zeros(2, 3)
    for wrong in (torch.zeros(3), torch.zeros(2, 2), torch.zeros(2, 3, 1)):
        with pytest.raises(ValueError, match=r"advantages must be \(B,\) = \(2,\) or \(B, T\) = \(2, 3\)"):
            ppo_clip_loss(lp, lp, wrong, torch.ones(2, 3))


def test_ppo_per_token_advantages_equal_rows_where_constant_and_weigh_each_token_alone():
    """A (B, T) advantage equal along a row is that row's (B,) advantage, padding aside; and a
    token's gradient follows its own advantage only (the critic's credit along an answer)."""
    torch.manual_seed(0)
    lp = torch.randn(2, 4, requires_grad=True)
    old = lp.detach() + 0.05 * torch.randn(2, 4)
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 1]])
    rows = torch.tensor([0.7, -0.4])
    per_token = torch.tensor([[0.7, 0.7, 0.7, 99.0], [-0.4, -0.4, -0.4, -0.4]])  # 99: padding, masked out
    a, _ = ppo_clip_loss(lp, old, rows, mask)
    b, _ = ppo_clip_loss(lp, old, per_token, mask)
    assert float(a.detach()) == float(b.detach())
    credit = torch.tensor([[0.0, -1.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]])
    loss, _ = ppo_clip_loss(lp, lp.detach(), credit, mask)
    (grad,) = torch.autograd.grad(loss, lp)
    # at ratio 1 the per-token loss is -A * ratio: d/dlp = -A / normalizer (7 masked tokens)
    assert grad.flatten().tolist() == pytest.approx((-credit * mask / 7).flatten().tolist())


def test_bce_unweighted_and_weighted():
    logits = torch.tensor([0.0, math.log(3.0)], requires_grad=True)  # V = 0.5, 0.75
    targets = torch.tensor([1.0, 0.0])
    # row 0: -ln 0.5 = ln 2; row 1: -ln(1 - 0.75) = ln 4 = 2 ln 2
    # unweighted mean = (ln 2 + 2 ln 2) / 2 = 1.5 ln 2
    assert_close(critic_bce_loss(logits, targets), scalar(1.5 * math.log(2)))
    # weights [3, 1]: (3 ln 2 + 2 ln 2) / 4 = 1.25 ln 2
    assert_close(critic_bce_loss(logits, targets, torch.tensor([3.0, 1.0])), scalar(1.25 * math.log(2)))


def test_bce_soft_target():
    # V = 0.75, target 0.75: -(0.75 ln 0.75 + 0.25 ln 0.25) = 0.215762 + 0.346574 = 0.562335
    loss = critic_bce_loss(torch.tensor([math.log(3.0)]), torch.tensor([0.75]))
    assert_close(loss, scalar(0.562335))


def test_bce_zero_weights_is_zero_with_grad():
    logits = torch.tensor([0.3, -1.0], requires_grad=True)
    loss = critic_bce_loss(logits, torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]))
    assert_close(loss, scalar(0.0))
    assert loss.requires_grad
    loss.backward()
    assert_close(logits.grad, torch.zeros(2))


def test_ppo_row_weights_make_each_row_weigh_alike_whatever_its_length():
    # a 1-token row with A = 1 and a 3-token row with A = -1, at ratio 1 (per token: -A)
    lp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])
    by_token, _ = ppo_clip_loss(lp, lp, adv, mask)
    assert by_token.item() == pytest.approx((-1 + 3) / 4)  # the long row outweighs the short one
    mean_len = 4 / 2
    by_row, _ = ppo_clip_loss(lp, lp, adv, mask, row_weights=torch.tensor([mean_len / 1, mean_len / 3]))
    assert by_row.item() == pytest.approx(0.0, abs=1e-7)  # one row up, one row down: they cancel
    ones, _ = ppo_clip_loss(lp, lp, adv, mask, row_weights=torch.ones(2))
    assert ones.item() == by_token.item()


@pytest.mark.parametrize("weights", [torch.tensor([1.0, -0.5]), torch.ones(3)])
def test_ppo_row_weights_must_be_one_non_negative_weight_a_row(weights):
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="row_weights"):
        ppo_clip_loss(lp, lp, torch.ones(2), torch.ones(2, 3), row_weights=weights)
