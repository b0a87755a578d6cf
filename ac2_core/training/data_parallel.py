"""Data parallelism for the trainers: one optimizer step over the whole batch, taken by N processes.

The processes are started by torchrun (``ac2_core.stages.data_parallel``) and form one
torch.distributed group: gloo on CPU, nccl on GPU. Each trainer step then:

- deals the step's micro-batches out round robin (``share``): process ``r`` of ``N`` runs
  micro-batches ``r, r + N, ...``. A stage's losses are already normalized to the whole
  batch, so the gradient of the step is the *sum* of the processes' gradients;
- gives every process the same number of micro-batches: one that falls short repeats
  one of its own (or, with none, the first) at weight 0. ZeRO-3 gathers the weights of
  every layer in every forward, all processes together, so their forwards must pair up;
- sums the summed statistics (loss, clip fraction) over the processes
  (``all_reduce_totals``).

With one process nothing here changes a step: ``share`` returns the micro-batches as they
are, at weight 1, and nothing is reduced.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BUCKET_ELEMENTS = 1 << 25  # gradients are summed in flat buckets of at most this many elements (128 MiB in fp32)


@dataclass(frozen=True)
class Ranks:
    """This process's place in a launched group: ``rank`` of ``size``."""

    rank: int
    size: int

    @property
    def writes(self) -> bool:
        """Only rank 0 publishes artifacts; the others take part in gathering what it writes."""
        return self.rank == 0


def share(micro_batches: list, ranks: Ranks | None) -> list[tuple[object, float]]:
    """(micro-batch, weight) pairs this process runs: its round-robin share at weight 1,
    padded at weight 0 to the count every process runs. ``ranks`` None: all, at weight 1."""
    if ranks is None or ranks.size == 1:
        return [(mb, 1.0) for mb in micro_batches]
    if not micro_batches:
        return []
    mine = micro_batches[ranks.rank :: ranks.size]
    per_rank = -(-len(micro_batches) // ranks.size)
    filler = (mine or micro_batches)[-1]
    return [(mb, 1.0) for mb in mine] + [(filler, 0.0)] * (per_rank - len(mine))


def all_reduce_gradients(params: list[torch.nn.Parameter]) -> None:
    """Sum every parameter's gradient over the group, in place.

    A parameter that got no gradient on this process gets zeros when another process has
    one, so the sum is the same everywhere; one that no process gave a gradient keeps
    ``None``, as it would in one process (AdamW then leaves it alone).
    """
    if not params:
        return
    device = params[0].device
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
    torch.distributed.all_reduce(has)
    live = [p for p, h in zip(params, has.tolist()) if h]
    for p in live:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    for bucket in _buckets(live):
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        torch.distributed.all_reduce(flat)
        offset = 0
        for p in bucket:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()


def _buckets(params: list[torch.nn.Parameter]) -> list[list[torch.nn.Parameter]]:
    """Consecutive runs of parameters of one dtype and device, each at most BUCKET_ELEMENTS (or one parameter)."""
    out: list[list[torch.nn.Parameter]] = []
    size = 0
    for p in params:
        if out and size + p.numel() <= BUCKET_ELEMENTS and (p.dtype, p.device) == (out[-1][0].dtype, out[-1][0].device):
            out[-1].append(p)
            size += p.numel()
        else:
            out.append([p])
            size = p.numel()
    return out


def all_reduce_totals(totals: dict[str, float], device: torch.device) -> dict[str, float]:
    """The sums of ``totals`` over the group (every process has the same keys: ``share`` runs one
    micro-batch at least on each, whenever there is one)."""
    keys = sorted(totals)
    values = torch.tensor([totals[k] for k in keys], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(values)
    return dict(zip(keys, values.tolist()))


def add_totals(totals: dict[str, float], loss: torch.Tensor, stats: dict, weight: float) -> None:
    """Add one micro-batch's loss and statistics to ``totals``, at ``weight`` (0 for padding)."""
    for k, v in {"loss": float(loss.detach()), **stats}.items():
        totals[k] = totals.get(k, 0.0) + (v if weight == 1.0 else v * weight)
