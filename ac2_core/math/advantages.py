"""Chunk advantages and the readiness gate (docs/design.md section 2, step 4).

A group is one prefix continued `G` times; its rows are chunks (or full rollouts in
full mode). Where this departs from plain GRPO:

- The default baseline is the leave-one-out mean of the *other* chunks of the group,
  not the group mean, and advantages are not std-scaled by default.
- The baseline may instead be the critic's value at the chunk's start, `V(x, s)`.
- Targets are `R` for finished chunks and `V(x, s+c)` for unfinished ones; on a
  problem that is not ready, critic targets get weight 0 (`gate_weights`).

`grpo_advantages` is plain GRPO: group-normalized terminal rewards.
"""

from __future__ import annotations

import torch

BASELINES = ("loo", "mean", "critic")


def group_advantages(
    targets: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    baseline: str = "loo",
    values_start: torch.Tensor | None = None,
    scale_std: bool = False,
    std_floor: float = 0.0,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row advantage `A = y - b` against a per-group baseline `b`.

    Args:
        targets: (B,) float. The target `y` of each row (`R` or `V(x, s+c)`).
        group_ids: (B,) int64. Rows with the same id form a group. Ids are arbitrary:
            they need not be contiguous, sorted or start at 0.
        baseline: "loo" (mean of the *other* rows of the group; a singleton group's
            baseline is its own target, so its advantage is 0), "mean" (group mean,
            self included) or "critic" (`values_start`).
        values_start: (B,) float. `V(x, s)` at each row's start; required when
            `baseline="critic"`, ignored otherwise.
        scale_std: divide advantages by the population std of the group's targets
            plus `eps`.
        std_floor: with `scale_std`, divide by at least this: a group whose targets
            differ by less than a real slip would make is amplified at most 1/std_floor
            times instead of to unit size.
        eps: added to the std before dividing.

    Returns:
        advantages: (B,) float, same dtype as `targets`.
        baselines: (B,) float, the baseline `b` each row was compared against.
    """
    if targets.dim() != 1 or group_ids.shape != targets.shape:
        raise ValueError(
            f"targets and group_ids must both be (B,); got targets {tuple(targets.shape)}, group_ids {tuple(group_ids.shape)}"
        )
    if not targets.is_floating_point():
        targets = targets.to(torch.float32)
    # Map arbitrary ids to 0..n_groups-1 so per-group sums are one index_add each.
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    counts = _group_sum(torch.ones_like(targets), inverse, n_groups)
    sums = _group_sum(targets, inverse, n_groups)
    group_mean = (sums / counts)[inverse]

    match baseline:
        case "loo":
            n = counts[inverse]
            # Leave-one-out keeps the baseline independent of the row's own target,
            # so the advantage is unbiased (GRPO's group mean includes self).
            others = (sums[inverse] - targets) / (n - 1).clamp(min=1)
            baselines = torch.where(n > 1, others, targets)
        case "mean":
            baselines = group_mean
        case "critic":
            if values_start is None:
                raise ValueError("baseline='critic' needs values_start (B,); got None")
            if values_start.shape != targets.shape:
                raise ValueError(f"values_start must be (B,) = {tuple(targets.shape)}; got {tuple(values_start.shape)}")
            # The critic's V(x, s) is a baseline that depends only on the state.
            baselines = values_start.to(targets.dtype)
        case _:
            raise ValueError(f"baseline must be one of {BASELINES}; got {baseline!r}")

    advantages = targets - baselines
    if scale_std:
        # Population std (unbiased=False): a 2-sample group [1, 0] has std 0.5 and
        # gets advantages of exactly ±1 under the mean baseline, as in GRPO.
        dev_sq = (targets - group_mean) ** 2
        std = (_group_sum(dev_sq, inverse, n_groups) / counts).sqrt()
        advantages = advantages / (std[inverse].clamp(min=std_floor) + eps)
    return advantages, baselines


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    scale_std: bool = True,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO's group-normalized terminal reward: `(r - mean_g) / (std_g + eps)`.

    Args:
        rewards: (B,) float. Terminal reward of each full rollout.
        group_ids: (B,) int64. The `G` rollouts of one problem share an id.
        scale_std: divide by the group's population std plus `eps`.
        eps: added to the std before dividing.

    Returns:
        advantages: (B,) float.
        baselines: (B,) float, the group mean `mean_g` of each row.
    """
    return group_advantages(rewards, group_ids, baseline="mean", scale_std=scale_std, eps=eps)


def replay_rate_advantages(rewards: torch.Tensor, rates: torch.Tensor, *, scale_std: bool = True) -> torch.Tensor:
    """Each answer against its problem's success rate ``b`` as known before it was sampled:
    ``A = R - b``, divided by ``sqrt(b (1 - b))`` with ``scale_std`` (the std a group's rewards
    would have at that rate, as GRPO divides by its group's).

    Args:
        rewards: (B,) float. Terminal reward of each whole answer.
        rates: (B,) float in (0, 1). The baseline of each answer's problem (smoothed, so never
            0 or 1: the scale stays finite).
        scale_std: divide by ``sqrt(b (1 - b))``.

    Returns:
        advantages: (B,) float.
    """
    if rewards.shape != rates.shape or rewards.dim() != 1:
        raise ValueError(f"rewards and rates must both be (B,); got {tuple(rewards.shape)} and {tuple(rates.shape)}")
    advantages = rewards - rates
    if scale_std:
        if bool(((rates <= 0) | (rates >= 1)).any()):
            raise ValueError("rates must lie strictly between 0 and 1 to scale by sqrt(b (1 - b))")
        advantages = advantages / (rates * (1 - rates)).sqrt()
    return advantages


def critic_credit(values: list[float], reward: float, length: int, chunk_tokens: int, *, lam: float = 0.0) -> list[float]:
    """Per-token advantages of one finished answer from the critic's values along it.

    The answer is cut into segments of ``chunk_tokens`` tokens, the action chunks it is made
    of; segment ``j`` starts in state ``s_j`` (the answer's first ``j * chunk_tokens`` tokens)
    and each of its tokens gets ``V(s_{j+1}) - V(s_j)``, with the reward as the last segment's
    ``V(s_{j+1})``. The advantages of the segments telescope to ``R - V(s_0)``: the answer's
    credit for its outcome, given where each chunk of it moved the value.

    With ``lam > 0`` a segment also takes the later segments' changes, discounted by ``lam``
    per segment: ``A_j = sum_k lam^k (V(s_{j+k+1}) - V(s_{j+k}))``, GAE over segments with no
    discount in time. ``lam = 1`` gives every segment ``R - V(s_j)``, the per-state baseline:
    a critic wrong about where an answer slipped then moves less of the blame than at
    ``lam = 0``, and a flat critic gives every token the outcome against one baseline.

    Args:
        values: ``V(s_j)`` at each segment's start: one per multiple of ``chunk_tokens`` below
            ``length``, 0 included.
        reward: the answer's terminal reward ``R``.
        length: the answer's length in tokens.
        chunk_tokens: the segment length ``L``.
        lam: how much of the later segments' changes each segment takes, in [0, 1].

    Returns:
        ``length`` floats.
    """
    if length < 1 or chunk_tokens < 1:
        raise ValueError(f"length and chunk_tokens must be >= 1; got {length} and {chunk_tokens}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1]; got {lam}")
    n_segments = -(-length // chunk_tokens)
    if len(values) != n_segments:
        raise ValueError(
            f"an answer of {length} tokens in segments of {chunk_tokens} needs {n_segments} values; got {len(values)}"
        )
    ends = [*values[1:], reward]
    per_segment = [0.0] * n_segments
    later = 0.0  # the next segment's advantage, lam of which this segment takes
    for j in reversed(range(n_segments)):
        later = per_segment[j] = ends[j] - values[j] + lam * later
    credit = []
    for j, a in enumerate(per_segment):
        credit += [a] * (min(length, (j + 1) * chunk_tokens) - j * chunk_tokens)
    return credit


def gate_weights(target_from_critic: torch.Tensor, problem_ready: torch.Tensor) -> torch.Tensor:
    """Loss weight of each row: 0 for critic targets on problems that are not ready.

    Args:
        target_from_critic: (B,) bool. True where the target is `V(x, s+c)`, i.e. the
            chunk did not finish.
        problem_ready: (B,) bool. Whether the row's problem is ready *now*.

    Returns:
        weights: (B,) float32, 0.0 or 1.0.
    """
    # An uncalibrated critic's targets would teach the policy the critic's errors.
    masked = target_from_critic.bool() & ~problem_ready.bool()
    return (~masked).to(torch.float32)


def _group_sum(values: torch.Tensor, inverse: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Sum `values` (B,) into (n_groups,) by the group index `inverse` (B,)."""
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, inverse, values)
