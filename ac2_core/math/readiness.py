"""Per-problem readiness of the critic (docs/design.md section 2, step 4).

A problem's window holds (prediction, outcome) pairs: the critic's `V` at a chunk
boundary of a finished trajectory, scored before the critic trained on it, and that
trajectory's reward. Where this departs from the AC2 paper's per-sample rule:

- The error is not the per-sample mean `|V - R|`, which punishes honest uncertainty:
  a perfect critic on a problem solved half the time scores 0.5.
- The default rule, `discriminating`, asks for two things at once: the critic must beat
  the problem's own base rate on its window (AUC at least `min_auc` and a positive Brier
  skill against the window's success rate), and be calibrated (binned calibration error
  at most `max_error`). Calibration alone admits a critic that predicts each problem's
  success rate and cannot tell a good partial answer from a bad one: a constant is
  perfectly calibrated on a window whose rate it matches. The single-number rules
  (binned calibration error, Brier ratio, 1 - AUC) stay selectable.
- By default a problem is ready only if its window holds both successes and failures,
  since readiness on problems that always fail or always succeed carries no signal.

Inputs may be lists, numpy arrays or torch tensors; results are python floats.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

METRICS = ("discriminating", "binned_calibration", "brier_ratio", "auc")


def binned_calibration_error(predictions: Any, outcomes: Any, *, n_bins: int = 10) -> float:
    """Expected calibration error: `sum_b (n_b / N) * |mean pred_b - mean outcome_b|`.

    Bins are `n_bins` equal-width intervals of the prediction over [0, 1]; a prediction
    of exactly 1.0 goes in the last bin.

    Args:
        predictions: (N,) in [0, 1]. Critic values `V`.
        outcomes: (N,) in [0, 1]. Terminal rewards `R`.
        n_bins: number of bins.

    Returns:
        The error in [0, 1]; nan when N = 0.
    """
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1; got {n_bins}")
    p, o = _pairs(predictions, outcomes)
    if p.size == 0:
        return float("nan")
    bins = np.clip(np.floor(p * n_bins).astype(np.int64), 0, n_bins - 1)
    sum_p = np.bincount(bins, weights=p, minlength=n_bins)
    sum_o = np.bincount(bins, weights=o, minlength=n_bins)
    # (n_b / N) * |sum_p_b / n_b - sum_o_b / n_b| = |sum_p_b - sum_o_b| / N; empty bins add 0.
    return float(np.abs(sum_p - sum_o).sum() / p.size)


def brier_ratio(predictions: Any, outcomes: Any) -> float:
    """Brier score of the predictions over that of the window's own success rate.

    `mean((p - o)^2) / mean((p_bar - o)^2)` with `p_bar = mean(o)`. Lower is better;
    1.0 is no better than predicting the base rate (1 - Brier skill score).

    Args:
        predictions: (N,) in [0, 1]. Critic values `V`.
        outcomes: (N,) in [0, 1]. Terminal rewards `R`.

    Returns:
        The ratio; nan when N = 0 or all outcomes are equal.
    """
    p, o = _pairs(predictions, outcomes)
    if p.size == 0:
        return float("nan")
    base = float(np.mean((o.mean() - o) ** 2))
    # All-equal outcomes give a zero denominator: readiness must not be trivially
    # earned on problems that always succeed or always fail.
    if base == 0.0:
        return float("nan")
    return float(np.mean((p - o) ** 2)) / base


def auc_error(predictions: Any, outcomes: Any) -> float:
    """1 - AUC of the predictions for outcomes binarized at 0.5 (ties count 1/2).

    Args:
        predictions: (N,) in [0, 1]. Critic values `V`.
        outcomes: (N,) in [0, 1]. Terminal rewards `R`; `R >= 0.5` is a success.

    Returns:
        1 - P(V_success > V_failure) - P(tie) / 2; nan unless both classes are present.
    """
    p, o = _pairs(predictions, outcomes)
    positive = o >= 0.5
    n_pos = int(positive.sum())
    n_neg = p.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    # Mann-Whitney U with average ranks: tied values share the mean of their ranks,
    # which counts each positive/negative tie as 1/2.
    _, inverse, counts = np.unique(p, return_inverse=True, return_counts=True)
    average_rank = np.cumsum(counts) - (counts - 1) / 2.0
    rank_sum = average_rank[inverse][positive].sum()
    auc = (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)
    return float(1.0 - auc)


def readiness_error(predictions: Any, outcomes: Any, *, metric: str, n_bins: int = 10) -> float:
    """The readiness error of one window under `metric`.

    Args:
        predictions: (N,) in [0, 1]. Critic values `V`.
        outcomes: (N,) in [0, 1]. Terminal rewards `R`.
        metric: "binned_calibration", "brier_ratio" or "auc" (as 1 - AUC); "discriminating"
            reports its calibration part, the binned calibration error.
        n_bins: bins for the binned calibration error; ignored by the others.

    Returns:
        The error (lower is better), or nan where the metric is undefined.
    """
    match metric:
        case "binned_calibration" | "discriminating":
            return binned_calibration_error(predictions, outcomes, n_bins=n_bins)
        case "brier_ratio":
            return brier_ratio(predictions, outcomes)
        case "auc":
            return auc_error(predictions, outcomes)
        case _:
            raise ValueError(f"metric must be one of {METRICS}; got {metric!r}")


def is_ready(
    predictions: Any,
    outcomes: Any,
    *,
    metric: str,
    min_pairs: int,
    max_error: float,
    require_mixed_outcomes: bool = True,
    n_bins: int = 10,
    min_auc: float = 0.7,
) -> tuple[bool, float]:
    """Whether a problem's window makes its critic targets usable.

    Ready iff the window has at least `min_pairs` pairs, the error is defined and at
    most `max_error`, and (when `require_mixed_outcomes`) it holds at least one
    outcome >= 0.5 and one < 0.5. Under `metric="discriminating"` the critic must also
    beat the window's base rate: AUC >= `min_auc` and Brier ratio < 1 (both need the two
    outcomes, so this metric never admits a one-class window).

    Args:
        predictions: (N,) in [0, 1]. Critic values `V`, scored out of sample.
        outcomes: (N,) in [0, 1]. Terminal rewards `R`.
        metric: see `readiness_error`.
        min_pairs: minimum window size N.
        max_error: largest error that still counts as ready.
        require_mixed_outcomes: demand both a success and a failure in the window.
        n_bins: bins for the binned calibration error.
        min_auc: "discriminating" only: the smallest AUC that beats the base rate.

    Returns:
        ready: python bool.
        error: the window's error (nan where undefined), reported even when not ready.
    """
    error = readiness_error(predictions, outcomes, metric=metric, n_bins=n_bins)
    p, o = _pairs(predictions, outcomes)
    # docs/design.md sections 2 and 7: on always-fail (or always-succeed) problems a critic
    # is "calibrated" by memorising the base rate, and its targets carry no signal.
    mixed = bool((o >= 0.5).any() and (o < 0.5).any())
    ready = o.size >= min_pairs and not math.isnan(error) and error <= max_error and (mixed or not require_mixed_outcomes)
    if ready and metric == "discriminating":
        # 1 - auc_error and brier_ratio are nan on a one-class window; nan comparisons are False
        ready = (1.0 - auc_error(p, o)) >= min_auc and brier_ratio(p, o) < 1.0
    return bool(ready), error


def _pairs(predictions: Any, outcomes: Any) -> tuple[np.ndarray, np.ndarray]:
    """Convert both inputs to float64 (N,) arrays and check they match."""
    p, o = _as_array(predictions), _as_array(outcomes)
    if p.ndim != 1 or p.shape != o.shape:
        raise ValueError(f"predictions and outcomes must both be (N,); got {p.shape} and {o.shape}")
    return p, o


def _as_array(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, possibly on GPU or with grad
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)
