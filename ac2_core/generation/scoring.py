"""Critic scoring: V for many token-id inputs in length-sorted, padded batches.

Identical inputs are scored once (the G chunks of a group share their start state), and
rows are sorted by length so little padding is computed.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def score_inputs(critic, inputs: list[list[int]], *, pad_id: int, batch_size: int) -> list[float]:
    """V in [0, 1] for each input (a list of token ids), in input order."""
    values: dict[tuple, float] = {}
    for batch in score_plan(inputs, batch_size=batch_size):
        values.update(zip(batch, score_batch(critic, batch, pad_id=pad_id)))
    return [values[tuple(x)] for x in inputs]


def score_plan(inputs: list[list[int]], *, batch_size: int) -> list[list[tuple]]:
    """The batches ``score_inputs`` runs: the distinct inputs, sorted by length, cut into batches."""
    unique = sorted(set(map(tuple, inputs)), key=lambda x: (len(x), x))
    return [unique[start : start + batch_size] for start in range(0, len(unique), batch_size)]


@torch.no_grad()
def score_batch(critic, batch: list[tuple], *, pad_id: int) -> list[float]:
    """V of each input of one batch, right-padded to the batch's longest."""
    return critic.values(*_padded(critic, batch, pad_id=pad_id)).float().cpu().tolist()


def _padded(critic, batch: list[tuple], *, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)`` of one batch, right-padded to its longest input, on the critic's device."""
    device = next(critic.parameters()).device
    width = max(len(x) for x in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, x in enumerate(batch):
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    return ids.to(device), mask.to(device)


def unique_inputs(inputs: list[list[int]]) -> list[tuple]:
    """The distinct inputs, in first-seen order (what ``score_inputs`` actually runs)."""
    return list(dict.fromkeys(map(tuple, inputs)))


@torch.no_grad()
def score_positions(critic, inputs: list[tuple[list[int], list[int]]], *, pad_id: int, batch_size: int) -> list[list[float]]:
    """V at chosen positions of each input: ``(token ids, positions)`` -> the values there.

    The critic is causal, so position ``t`` of an input holds V of the input cut after token
    ``t``: one pass over a whole answer scores every state along it. Identical token lists are
    run once; rows are sorted by length so little padding is computed.
    """
    every: dict[tuple, torch.Tensor] = {}
    for batch in score_plan([x for x, _ in inputs], batch_size=batch_size):
        v = torch.sigmoid(critic(*_padded(critic, batch, pad_id=pad_id), every_position=True)).float().cpu()
        every.update((x, v[i, : len(x)]) for i, x in enumerate(batch))
    return [every[tuple(x)][positions].tolist() for x, positions in inputs]
