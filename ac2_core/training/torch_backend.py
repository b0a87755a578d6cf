"""The ``torch`` training backend: AdamW, micro-batched gradient accumulation, clipping.

One ``Trainer`` wraps a model and its optimizer. ``step`` accumulates gradients over
micro-batches whose losses are already normalized to the whole batch, then clips and
steps once. ``save``/``load`` put the optimizer state beside the model files so that a
run resumes exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from ac2_core.training.optim_state import load_optimizer, save_optimizer
from ac2_core.training.schedule import WarmupFromOptimizerState


class Trainer(WarmupFromOptimizerState):
    def __init__(self, model: torch.nn.Module, *, lr: float, weight_decay: float, max_grad_norm: float, warmup_steps: int = 0):
        self.model = model
        self.lr = lr
        self.warmup_steps = warmup_steps
        self.max_grad_norm = max_grad_norm
        params = [p for p in model.parameters() if p.requires_grad]
        # foreach=False: one fixed kernel order, so reruns are bit-identical on CPU.
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=False)

    def step(self, micro_batches: Iterable, loss_fn: Callable[[torch.nn.Module, object], tuple[torch.Tensor, dict]]) -> dict:
        """One optimizer step over all ``micro_batches``; returns summed stats and grad norm."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        for mb in micro_batches:
            loss, stats = loss_fn(self.model, mb)
            loss.backward()
            for k, v in {"loss": float(loss.detach()), **stats}.items():
                totals[k] = totals.get(k, 0.0) + v
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        for group in self.optimizer.param_groups:
            group["lr"] = self.current_lr()
        self.optimizer.step()
        self.model.eval()
        return totals | {"grad_norm": float(grad_norm)}

    def save(self, folder: Path) -> None:
        save_optimizer(self.optimizer, self.model, folder)

    def load(self, folder: Path) -> bool:
        return load_optimizer(self.optimizer, self.model, folder)
