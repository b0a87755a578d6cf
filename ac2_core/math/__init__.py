"""Pure math of AC2: advantages, losses, readiness and compute accounting."""

from ac2_core.math.advantages import critic_credit, gate_weights, group_advantages, grpo_advantages, replay_rate_advantages
from ac2_core.math.flops import (
    attention_width,
    count_non_embedding_params,
    critic_flops,
    decode_flops,
    prefill_flops,
    train_flops,
)
from ac2_core.math.losses import critic_bce_loss, ppo_clip_loss
from ac2_core.math.readiness import (
    auc_error,
    binned_calibration_error,
    brier_ratio,
    is_ready,
    readiness_error,
)

__all__ = [
    "attention_width",
    "auc_error",
    "binned_calibration_error",
    "brier_ratio",
    "count_non_embedding_params",
    "critic_bce_loss",
    "critic_credit",
    "critic_flops",
    "decode_flops",
    "gate_weights",
    "group_advantages",
    "grpo_advantages",
    "is_ready",
    "ppo_clip_loss",
    "prefill_flops",
    "readiness_error",
    "replay_rate_advantages",
    "train_flops",
]
