"""The ``torch`` training backend: AdamW, micro-batched gradient accumulation, clipping.

One ``Trainer`` wraps a model and its optimizer. ``step`` accumulates gradients over
micro-batches whose losses are already normalized to the whole batch, then clips and
steps once. ``save``/``load`` put the optimizer state beside the model files so that a
run resumes exactly.

In a launched group (``ranks``), every process holds the whole model and optimizer, runs
its share of the micro-batches, and the gradients are summed over the group before the
clip (``training.data_parallel``): each process then takes the same step. Rank 0 saves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch

from ac2_core.training import data_parallel
from ac2_core.training.data_parallel import Ranks
from ac2_core.training.optim_state import load_optimizer, save_optimizer
from ac2_core.training.schedule import WarmupFromOptimizerState


class Trainer(WarmupFromOptimizerState):
    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lr: float,
        weight_decay: float,
        max_grad_norm: float,
        warmup_steps: int = 0,
        ranks: Ranks | None = None,
    ):
        self.model = model
        self.ranks = ranks
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
        for mb, weight in data_parallel.share(list(micro_batches), self.ranks):
            loss, stats = loss_fn(self.model, mb)
            (loss if weight == 1.0 else loss * weight).backward()
            data_parallel.add_totals(totals, loss, stats, weight)
        if self.ranks is not None and self.ranks.size > 1:
            data_parallel.all_reduce_gradients([p for p in self.model.parameters() if p.requires_grad])
            totals = data_parallel.all_reduce_totals(totals, next(self.model.parameters()).device)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        for group in self.optimizer.param_groups:
            group["lr"] = self.current_lr()
        self.optimizer.step()
        self.model.eval()
        return totals | {"grad_norm": float(grad_norm)}

    @contextlib.contextmanager
    def whole_weights(self) -> Iterator[None]:
        """The model's parameters hold its whole weights inside (always, here: every process keeps them)."""
        yield

    def save(self, folder: Path | None) -> None:
        """Write the optimizer state to ``folder``; None (a rank that does not publish): nothing to do."""
        if folder is not None:
            save_optimizer(self.optimizer, self.model, folder)

    def load(self, folder: Path) -> bool:
        return load_optimizer(self.optimizer, self.model, folder)
