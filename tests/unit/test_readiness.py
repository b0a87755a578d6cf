"""Hand-computed checks of ac2_core.math.readiness."""

import math

import numpy as np
import pytest
import torch

from ac2_core.math.readiness import (
    auc_error,
    binned_calibration_error,
    brier_ratio,
    is_ready,
    readiness_error,
)


def approx(x):
    return pytest.approx(x, rel=1e-6, abs=1e-9)  # float32 tensors are accepted too


def test_binned_calibration_ten_bins_and_one_in_last_bin():
    pred, out = [0.05, 0.15, 0.95, 1.0], [0, 1, 1, 0]
    # bins: 0.05 -> 0, 0.15 -> 1, 0.95 and 1.0 -> 9 (1.0 joins the last bin)
    # bin 0: |0.05 - 0| = 0.05; bin 1: |0.15 - 1| = 0.85; bin 9: |0.975 - 0.5| = 0.475
    # error = 1/4 * 0.05 + 1/4 * 0.85 + 2/4 * 0.475 = 0.0125 + 0.2125 + 0.2375 = 0.4625
    # (a separate bin for 1.0 would give (0.05 + 0.85 + 0.05 + 1.0) / 4 = 0.4875)
    assert binned_calibration_error(pred, out) == approx(0.4625)


def test_binned_calibration_two_bins():
    pred, out = [0.2, 0.4, 0.6, 0.8], [0, 1, 1, 1]
    # bin [0, 0.5): mean pred 0.3, mean outcome 0.5 -> 2/4 * 0.2 = 0.1
    # bin [0.5, 1]: mean pred 0.7, mean outcome 1.0 -> 2/4 * 0.3 = 0.15; total 0.25
    assert binned_calibration_error(pred, out, n_bins=2) == approx(0.25)


def test_binned_calibration_empty_is_nan():
    assert math.isnan(binned_calibration_error([], []))


def test_brier_ratio():
    pred, out = [0.8, 0.2, 0.6, 0.4], [1, 0, 1, 0]
    # Brier = (0.2^2 + 0.2^2 + 0.4^2 + 0.4^2) / 4 = 0.4 / 4 = 0.1
    # base rate 0.5: Brier = 0.5^2 = 0.25 -> ratio 0.1 / 0.25 = 0.4
    assert brier_ratio(pred, out) == approx(0.4)
    # predicting the base rate itself: 0.25 / 0.25 = 1.0
    assert brier_ratio([0.5] * 4, out) == approx(1.0)


def test_brier_ratio_one_class_is_nan():
    # all outcomes 1: base-rate Brier is 0, so the ratio is undefined
    assert math.isnan(brier_ratio([0.9, 0.8], [1, 1]))


def test_auc_error_with_tie():
    pred, out = [0.9, 0.4, 0.6, 0.4], [1, 1, 0, 0]
    # positives {0.9, 0.4}, negatives {0.6, 0.4}; pairs: (0.9, 0.6) 1, (0.9, 0.4) 1,
    # (0.4, 0.6) 0, (0.4, 0.4) tie 1/2 -> AUC = 2.5 / 4 = 0.625 -> error 0.375
    assert auc_error(pred, out) == approx(0.375)
    # non-binary outcomes binarize at 0.5: [0.7, 0.5, 0.2, 0.0] -> [1, 1, 0, 0], same answer
    assert auc_error(pred, [0.7, 0.5, 0.2, 0.0]) == approx(0.375)


def test_auc_error_one_class_is_nan():
    assert math.isnan(auc_error([0.1, 0.9], [0, 0]))
    assert math.isnan(auc_error([0.1, 0.9], [1, 1]))


def test_readiness_error_dispatch_and_inputs():
    pred, out = [0.8, 0.2, 0.6, 0.4], [1, 0, 1, 0]
    # brier_ratio: 0.4 (see test_brier_ratio); auc: every positive outranks every negative -> 0
    assert readiness_error(pred, out, metric="brier_ratio") == approx(0.4)
    assert readiness_error(pred, out, metric="auc") == approx(0.0)
    # binned, 2 bins: [0.2, 0.4] vs [0, 0] -> 2/4 * 0.3; [0.6, 0.8] vs [1, 1] -> 2/4 * 0.3; = 0.3
    for p, o in ((pred, out), (np.array(pred), np.array(out)), (torch.tensor(pred), torch.tensor(out))):
        assert readiness_error(p, o, metric="binned_calibration", n_bins=2) == approx(0.3)


def test_readiness_error_unknown_metric():
    with pytest.raises(ValueError, match="binned_calibration.*brier_ratio.*auc.*got 'mae'"):
        readiness_error([0.5], [1], metric="mae")


def test_honest_uncertainty_is_ready_under_binned_calibration():
    # a perfectly calibrated critic on a problem solved half the time: V = 0.5 everywhere.
    # per-sample mean |V - R| = 0.5, but the single bin has mean V 0.5 = mean R 0.5 -> error 0
    pred, out = [0.5, 0.5, 0.5, 0.5], [1, 0, 1, 0]
    assert is_ready(pred, out, metric="binned_calibration", min_pairs=4, max_error=0.1) == (True, 0.0)


def test_is_ready_needs_min_pairs():
    pred, out = [0.5, 0.5, 0.5, 0.5], [1, 0, 1, 0]
    # 4 pairs < 5; the error (0) is still reported
    assert is_ready(pred, out, metric="binned_calibration", min_pairs=5, max_error=0.1) == (False, 0.0)


def test_is_ready_needs_mixed_outcomes_by_default():
    # a critic that predicts 0 on an always-fail problem: error 0, but no signal
    pred, out = [0.0, 0.0, 0.0], [0, 0, 0]
    kwargs = dict(metric="binned_calibration", min_pairs=3, max_error=0.1)
    assert is_ready(pred, out, **kwargs) == (False, 0.0)
    assert is_ready(pred, out, require_mixed_outcomes=False, **kwargs) == (True, 0.0)


def test_is_ready_error_above_max_or_nan():
    pred, out = [0.8, 0.2, 0.6, 0.4], [1, 0, 1, 0]
    # brier ratio 0.4 (see test_brier_ratio): ready at max 0.5, not at max 0.3
    assert is_ready(pred, out, metric="brier_ratio", min_pairs=4, max_error=0.5) == (True, approx(0.4))
    assert is_ready(pred, out, metric="brier_ratio", min_pairs=4, max_error=0.3) == (False, approx(0.4))
    # one-class window: brier ratio is nan -> never ready, even without the mixed requirement
    ready, error = is_ready([0.9, 0.9], [1, 1], metric="brier_ratio", min_pairs=1, max_error=1.0, require_mixed_outcomes=False)
    assert ready is False and math.isnan(error)


# ---- the discriminating rule: beat the window's base rate, and be calibrated

DISCRIMINATING = dict(metric="discriminating", min_pairs=8, max_error=0.15, n_bins=5, min_auc=0.7)


def _windows(seed: int, n: int = 200):
    """Random windows of 8-32 outcomes with both classes, at success rates from 0.1 to 0.9."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        size = int(rng.integers(8, 33))
        rate = float(rng.uniform(0.1, 0.9))
        out = (rng.random(size) < rate).astype(float)
        out[0], out[1] = 1.0, 0.0  # both classes, so only the critic can close the gate
        yield rng, out


def test_a_constant_critic_is_never_ready():
    # a constant V has AUC 1/2 on every window (all ties): whatever the constant, and
    # however calibrated, it cannot beat the base rate
    for rng, out in _windows(0):
        for v in (float(out.mean()), 0.5, float(rng.uniform())):
            ready, _ = is_ready([v] * len(out), out, **DISCRIMINATING)
            assert not ready


def test_a_critic_that_knows_only_the_problems_rate_is_never_ready():
    # V = the window's own success rate (the best a critic blind to the state can do):
    # calibration error 0, so the calibration-only rule admits it; AUC 1/2 and Brier skill 0
    for _, out in _windows(1):
        pred = [float(out.mean())] * len(out)
        assert is_ready(pred, out, **DISCRIMINATING)[0] is False
        assert is_ready(pred, out, metric="binned_calibration", min_pairs=8, max_error=0.15, n_bins=5)[0] is True


def test_a_discriminating_calibrated_critic_is_ready():
    # 6 successes at V = 0.8 and 10 failures at V = 0.2 (one failure at 0.8 as noise):
    # AUC = (6 * 9 + 6 * 1 * 1/2) / (6 * 10) = 57 / 60 = 0.95;
    # bins (5): [0.2] x 9 -> |0.2 - 0| = 0.2 on 9/16; [0.8] x 7 -> |0.8 - 6/7| = 0.0571 on 7/16
    # calibration = (9 * 0.2 + 7 * 0.0571) / 16 = (1.8 + 0.4) / 16 = 0.1375 <= 0.15
    pred = [0.8] * 6 + [0.2] * 9 + [0.8]
    out = [1] * 6 + [0] * 10
    ready, error = is_ready(pred, out, **DISCRIMINATING)
    assert ready is True and error == approx(0.1375)
    # the same ranking but miscalibrated (V = 0.95 / 0.5): AUC still 0.95, calibration
    # (9 * 0.5 + 7 * |0.95 - 6/7|) / 16 = (4.5 + 0.65) / 16 = 0.3219 > 0.15
    assert is_ready([0.95] * 6 + [0.5] * 9 + [0.95], out, **DISCRIMINATING) == (False, approx(0.321875))
    # and a calibrated critic that ranks too weakly: AUC below min_auc
    assert is_ready(pred, out, **{**DISCRIMINATING, "min_auc": 0.96})[0] is False
