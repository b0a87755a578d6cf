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
    for batch, ids, mask in _batches(critic, inputs, pad_id=pad_id, batch_size=batch_size):
        values.update(zip(batch, critic.values(ids, mask).float().cpu().tolist()))
    return [values[tuple(x)] for x in inputs]


def _batches(critic, inputs, *, pad_id: int, batch_size: int):
    """The distinct inputs, sorted by length, as right-padded ``(batch, ids, mask)`` on the critic's device."""
    unique = sorted(set(map(tuple, inputs)), key=lambda x: (len(x), x))
    device = next(critic.parameters()).device
    for start in range(0, len(unique), batch_size):
        batch = unique[start : start + batch_size]
        width = max(len(x) for x in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, x in enumerate(batch):
            ids[i, : len(x)] = torch.tensor(x)
            mask[i, : len(x)] = 1
        yield batch, ids.to(device), mask.to(device)


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
    for batch, ids, mask in _batches(critic, [x for x, _ in inputs], pad_id=pad_id, batch_size=batch_size):
        v = torch.sigmoid(critic(ids, mask, every_position=True)).float().cpu()
        every.update((x, v[i, : len(x)]) for i, x in enumerate(batch))
    return [every[tuple(x)][positions].tolist() for x, positions in inputs]
