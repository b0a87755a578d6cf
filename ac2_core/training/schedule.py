"""The learning-rate schedule both training backends share, counted in AdamW's own steps."""

from __future__ import annotations

import torch


class WarmupFromOptimizerState:
    """``steps_taken`` and ``current_lr`` for a trainer with ``optimizer``, ``lr`` and ``warmup_steps``.

    The step count is read from AdamW's state, so it survives a checkpoint and a switch of
    backend between iterations.
    """

    optimizer: torch.optim.Optimizer
    lr: float
    warmup_steps: int

    @property
    def steps_taken(self) -> int:
        """Optimizer steps so far, read from AdamW's own state (so it survives a checkpoint)."""
        for state in self.optimizer.state.values():
            return int(state["step"])
        return 0

    def current_lr(self) -> float:
        """Linear warm-up over ``warmup_steps``: Adam's first, bias-corrected steps move every
        weight by about ``lr`` whatever its gradient, which shakes a warm-started policy."""
        if self.warmup_steps <= 0:
            return self.lr
        return self.lr * min(1.0, (self.steps_taken + 1) / self.warmup_steps)
