"""Actor and critic losses (docs/design.md section 2, steps 5 and 6).

The actor loss is PPO-clip over chunk tokens. Where it departs from plain PPO/GRPO:

- Clip low and clip high are set separately (DAPO's "clip-higher"), so low-probability
  tokens with positive advantage can grow more than they can shrink.
- The loss is aggregated per token over the whole batch by default, not per sequence, and
  the normalizer can be the global token count so micro-batches sum to the batch loss.
  ``row_weights`` gives each row its own weight instead (per-row aggregation).
- The KL to a reference model is optional and off by default (`kl_beta=0`).

The critic loss is a BCE on the value head's logits, since `V` predicts the expected
terminal reward in [0, 1].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    ref_logprobs: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    normalizer: float | torch.Tensor | None = None,
    row_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip policy loss, aggregated per token.

    Per token: `-min(r*A, clamp(r, 1-clip_low, 1+clip_high)*A)` with
    `r = exp(logprobs - old_logprobs)`, plus `kl_beta * k3` where
    `k3 = exp(ref - lp) - (ref - lp) - 1` when `kl_beta > 0`.
    The loss is `sum(per_token * mask) / normalizer`.

    Args:
        logprobs: (B, T) float. Log-probs of the sampled tokens under the current policy.
        old_logprobs: (B, T) float. Behaviour log-probs recorded at generation.
        advantages: (B,) float, one advantage per row broadcast over its tokens; or (B, T),
            one per token (the critic's credit along an answer), read where ``mask`` is 1.
        mask: (B, T) bool or float. 1 on chunk tokens that carry loss, 0 elsewhere
            (prompt, prefix, padding).
        clip_low: the ratio is clipped below at `1 - clip_low`.
        clip_high: the ratio is clipped above at `1 + clip_high`.
        ref_logprobs: (B, T) float. Reference-model log-probs; required if `kl_beta > 0`.
        kl_beta: weight of the k3 KL estimate to the reference model.
        normalizer: divide the masked sum by this. Defaults to `mask.sum()` (at least 1).
            Micro-batches pass the token count of the whole batch, so that their losses
            sum to the full-batch loss.
        row_weights: (B,) float, non-negative, or None. Multiplies every token term of a
            row (policy and KL). Per-row aggregation passes `mean length / row length`, so
            each row weighs the same whatever its length; None weighs every token alike.

    Returns:
        loss: scalar tensor.
        stats: python floats over masked tokens (nan when no token is masked in):
            `clip_fraction`, the share of tokens where the clipped branch was active;
            `approx_kl`, the k3 estimate of KL(old || new), mean of `r - 1 - log r`;
            `ratio_mean`, the mean ratio.
    """
    if logprobs.dim() != 2 or old_logprobs.shape != logprobs.shape or mask.shape != logprobs.shape:
        raise ValueError(
            f"logprobs, old_logprobs and mask must all be (B, T); got {tuple(logprobs.shape)}, "
            f"{tuple(old_logprobs.shape)}, {tuple(mask.shape)}"
        )
    if advantages.shape not in (logprobs.shape[:1], logprobs.shape):
        raise ValueError(
            f"advantages must be (B,) = ({logprobs.shape[0]},) or (B, T) = {tuple(logprobs.shape)}; got {tuple(advantages.shape)}"
        )
    if not 0.0 <= clip_low < 1.0 or clip_high < 0.0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0; got clip_low={clip_low}, clip_high={clip_high}")
    if kl_beta < 0.0:
        raise ValueError(f"kl_beta must be >= 0; got {kl_beta}")
    if kl_beta > 0.0 and ref_logprobs is None:
        raise ValueError(f"kl_beta={kl_beta} > 0 needs ref_logprobs (B, T); got None")
    if row_weights is not None and (row_weights.shape != logprobs.shape[:1] or bool((row_weights < 0).any())):
        raise ValueError(f"row_weights must be (B,) = ({logprobs.shape[0]},) and non-negative; got {row_weights.tolist()}")

    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype).detach()
    adv = adv[:, None] if adv.dim() == 1 else adv
    log_ratio = logprobs - old_logprobs.detach()
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if kl_beta > 0.0:
        # k3 is non-negative and unbiased for KL(pi || ref) on samples from pi.
        ref_diff = ref_logprobs.detach() - logprobs
        per_token = per_token + kl_beta * (torch.exp(ref_diff) - ref_diff - 1.0)
    if row_weights is not None:
        per_token = per_token * row_weights.to(per_token.dtype).detach()[:, None]

    if normalizer is None:
        # At least 1, so an all-padding micro-batch gives 0 rather than nan.
        normalizer = mask.sum().clamp(min=1.0)
    loss = (per_token * mask).sum() / normalizer

    with torch.no_grad():
        n_tokens = float(mask.sum())
        was_clipped = ((ratio > 1.0 + clip_high) & (adv > 0)) | ((ratio < 1.0 - clip_low) & (adv < 0))
        k3_old = ratio - 1.0 - log_ratio

        def masked_mean(x: torch.Tensor) -> float:
            return float((x.to(mask.dtype) * mask).sum()) / n_tokens if n_tokens else float("nan")

        stats = {
            "clip_fraction": masked_mean(was_clipped),
            "approx_kl": masked_mean(k3_old),
            "ratio_mean": masked_mean(ratio),
        }
    return loss, stats


def critic_bce_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Weighted mean binary cross-entropy of the value head against targets in [0, 1].

    Args:
        logits: (B,) float. Raw value-head outputs; `V = sigmoid(logits)`.
        targets: (B,) float in [0, 1]. Outcomes `R`, or bootstrapped `V(s+c)`.
        weights: (B,) float, optional. Per-row weight (e.g. `td_weight` on
            bootstrapped rows); all ones when None.

    Returns:
        loss: scalar tensor. When the weights sum to 0 it is 0 and still has a grad_fn,
            so callers can call `backward()` unconditionally.
    """
    if logits.dim() != 1 or targets.shape != logits.shape:
        raise ValueError(f"logits and targets must both be (B,); got {tuple(logits.shape)}, {tuple(targets.shape)}")
    per_row = F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype), reduction="none")
    if weights is None:
        weights = torch.ones_like(per_row)
    elif weights.shape != logits.shape:
        raise ValueError(f"weights must be (B,) = {tuple(logits.shape)}; got {tuple(weights.shape)}")
    weights = weights.to(per_row.dtype)
    total = weights.sum()
    if float(total) == 0.0:
        return logits.sum() * 0.0
    return (per_row * weights).sum() / total
