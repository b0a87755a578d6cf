"""The oracle critic: a diagnostic bound for task arith, never a learned critic's stand-in.

It answers what a perfect judge of partial answers would: ``V(s) = 0`` once the partial
answer ``s`` has left the problem's canonical worked solution (an error is written), and
otherwise the current policy's success rate from a correct partial answer of that depth.
That rate is a Monte Carlo estimate from this iteration's own full-mode answers: among
those that agree with their solution for their first ``d`` tokens, the share that
succeeded (add-one smoothed). So it decodes nothing beyond what the iteration already
decoded, and its values cost no critic FLOPs.

It reads the canonical solution, which no learned critic sees: runs with it separate what
the algorithm's structure allows from what a learned critic delivers (``critic.kind``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Literal

from ac2_core.tasks.arith import agrees


def whole_answers(scored: list[dict]) -> list[dict]:
    """The scored_chunks rows a diagnostic critic's values come from: this iteration's
    finished, graded full-mode answers."""
    return [s for s in scored if s["mode"] == "full" and s["finished"] and s["reward"] is not None]


def depth_rates(answers: list[tuple[str, str, float]]) -> tuple[list[int], list[float]]:
    """From (solution, answer text, reward) of finished full answers: for each depth ``d``
    at which some answer was still on its solution, ``(successes + 1) / (answers + 2)``.

    Returns the depths in increasing order and their rates.
    """
    counts: dict[int, list[float]] = {}
    for solution, text, reward in answers:
        on_track = 0  # the longest prefix of the answer that agrees with the solution
        while on_track < len(text) and on_track < len(solution) and text[on_track] == solution[on_track]:
            on_track += 1
        for d in range(min(on_track, len(text) - 1) + 1):  # states at depths 0..len-1 of the answer
            acc = counts.setdefault(d, [0.0, 0.0])
            acc[0] += reward
            acc[1] += 1
    depths = sorted(counts)
    return depths, [(counts[d][0] + 1.0) / (counts[d][1] + 2.0) for d in depths]


def whole_answer_rates(
    scored: list[dict], solution: Callable[[str], str], decode: Callable[[list[int]], str]
) -> tuple[list[int], list[float]]:
    """``depth_rates`` of an iteration's ``whole_answers``: ``solution`` maps a problem id to
    its worked solution, ``decode`` an answer's token ids to its text."""
    return depth_rates([(solution(s["problem_id"]), decode(s["response_token_ids"]), s["reward"]) for s in whole_answers(scored)])


def oracle_value(solution: str, state: str, depths: list[int], rates: list[float]) -> float:
    """V of one partial answer: 0 off the solution, else the rate at the deepest measured depth <= its own."""
    if not agrees(solution, state):
        return 0.0
    if not depths:
        return 0.5  # nothing measured yet: an honest "don't know"
    k = bisect.bisect_right(depths, len(state)) - 1
    return rates[max(k, 0)]


def chunk_group_class(
    solution: str, prefix: str, continuations: Sequence[tuple[str, bool, float | None]], success_threshold: float
) -> Literal["off_prefix", "mixed", "agreeing"]:
    """Which class of chunk group the oracle sees, from its ``prefix`` text and each
    continuation's ``(text, finished, reward)``, the text holding the prefix: an unfinished
    continuation stays on the ``solution`` while it agrees with it, a finished one when its
    reward reaches ``success_threshold``.

    off_prefix: the prefix has already left the solution; mixed: it has not, and the
    continuations differ in staying on; agreeing: they all stay on, or all leave.
    """
    if not agrees(solution, prefix):
        return "off_prefix"
    stays_on = {
        (reward or 0.0) >= success_threshold if finished else agrees(solution, text) for text, finished, reward in continuations
    }
    return "mixed" if len(stays_on) > 1 else "agreeing"
