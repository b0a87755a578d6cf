"""How much decoding chunk mode can save: a bound from the config, and the saving measured.

A full-mode group decodes ``G`` whole answers; a chunk-mode group decodes ``k`` prefixes'
continuations of at most ``L`` tokens each, ``G`` times. Only problems that have replay can be
ready, and a share of the ready ones stays in full mode as probes.
"""

from __future__ import annotations


def chunk_saving_bound(
    *,
    revisit_fraction: float,
    probe_fraction: float,
    prefixes_per_problem: int,
    chunk_tokens: int,
    answer_tokens: float,
    full_group_ratio: float = 1.0,
    smaller_for_revisits_only: bool = False,
) -> float:
    """The most decoding chunk mode can save in one iteration, as a share of full rollouts of the same problems.

    ``revisit_fraction * (1 - probe_fraction)`` of the problems can be in chunk mode (every
    revisited problem ready, only probes in full mode), and each saves
    ``1 - k * L / answer_tokens`` of its decoding (nothing when k chunks cost more than an answer).

    Args:
        revisit_fraction: share of an iteration's problems drawn from problems with replay.
        probe_fraction: share of ready problems kept in full mode.
        prefixes_per_problem: k, prefixes of a ready problem.
        chunk_tokens: L, the chunk budget.
        answer_tokens: mean length of a full answer, > 0.
        full_group_ratio: samples of a full-mode group over G (``rollout.full_group_size / group_size``);
            below 1 the problems left in full mode save ``1 - full_group_ratio`` too.
        smaller_for_revisits_only: the smaller full group is only for revisited problems (a
            replay-rate baseline needs a problem's earlier answers); new ones decode ``G``.

    Returns:
        A share in [0, 1).
    """
    if answer_tokens <= 0:
        raise ValueError(f"answer_tokens must be > 0; got {answer_tokens}")
    if not 0 < full_group_ratio <= 1:
        raise ValueError(f"full_group_ratio must be in (0, 1]; got {full_group_ratio}")
    per_problem = max(0.0, 1.0 - prefixes_per_problem * chunk_tokens / answer_tokens)
    chunk_share = revisit_fraction * (1.0 - probe_fraction)
    smaller_share = revisit_fraction * probe_fraction if smaller_for_revisits_only else 1.0 - chunk_share
    return chunk_share * per_problem + smaller_share * (1.0 - full_group_ratio)


def full_rollout_tokens(full_groups: list[list[int]], chunk_problems: int, group_size: int) -> float:
    """What decoding the iteration's problems in full mode alone would have cost.

    Each full-mode group counts ``G`` answers of its own mean length (its decoded answers
    when it had ``G``; a smaller group, ``rollout.full_group_size``, is scaled up); each
    chunk-mode problem counts ``G`` answers of the mean full-answer length of the same
    iteration (0 if the iteration decoded no full answer).

    Args:
        full_groups: (F,) the token counts of each full-mode group's answers.
        chunk_problems: problems decoded in chunk mode.
        group_size: G.
    """
    lengths = [n for group in full_groups for n in group]
    mean = sum(lengths) / len(lengths) if lengths else 0.0
    full = sum(sum(g) * group_size / len(g) for g in full_groups if g)  # exactly sum(g) for a group of G
    return float(full) + chunk_problems * group_size * mean
