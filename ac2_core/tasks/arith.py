"""The built-in task: add ``n_terms`` numbers, writing every running sum.

Prompt and canonical solution (one character is one token, see ``models.tokenizer``)::

    prompt:   "49+97+53+12+8+77\\n"
    solution: "49+97=146;146+53=199;199+12=211;211+8=219;219+77=296;#296"
    answer:   "296"

The worked solution is unique, so a partial answer can be judged position by position
against a reference solution (an earlier correct answer). That is why ac2 uses this
task: the critic has something it can learn to check (docs/design.md section 7).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from ac2_core.schemas import PROBLEMS

TASK = "arith"

# The final answer: '#' then a plain non-negative integer, and nothing after it.
_FINAL = re.compile(r"#([0-9]+)\Z")

# Below this ratio of distinct problems to problems needed, rejection sampling would
# spend most draws on repeats, so the (small) problem space is enumerated instead.
_ENUMERATE_RATIO = 4


def prompt_text(terms: list[int]) -> str:
    return "+".join(str(t) for t in terms) + "\n"


def solution_text(terms: list[int]) -> str:
    """The canonical worked solution: each running sum as ``a+b=c;``, then ``#total``."""
    if len(terms) < 2:
        raise ValueError(f"terms: expected at least 2 numbers, found {len(terms)}")
    steps = []
    total = terms[0]
    for term in terms[1:]:
        steps.append(f"{total}+{term}={total + term};")
        total += term
    return "".join(steps) + f"#{total}"


def terms_of(prompt: str) -> list[int]:
    """The numbers of a prompt written by ``prompt_text``."""
    return [int(t) for t in prompt.strip().split("+")]


# The misconception's triggers by default: a term whose ones digit is one of these.
MISCONCEIVED_DIGITS = (9,)


def misconceived_sum(total: int, term: int, digits: Sequence[int] = MISCONCEIVED_DIGITS) -> int:
    """``total + term`` as a hand with the misconception writes it: when ``term``'s ones digit
    is one of ``digits`` and the ones place carries, the carry is dropped (ten too few); every
    other step is right. ``149 + 39`` gives 178, ``140 + 39`` gives 179 (no carry)."""
    if term % 10 in digits and total % 10 + term % 10 >= 10:
        return total + term - 10
    return total + term


def misconceived(terms: list[int], *, rate: float, seed: int) -> bool:
    """Whether the problem ``terms`` is one whose demonstrations carry the misconception: a draw
    of probability ``rate`` fixed by the problem and ``seed`` alone, so every demonstration of
    the problem (the warm start's, the critic's reading pairs) agrees on it."""
    return bool(rate) and float(np.random.default_rng([seed, *terms]).random()) < rate


def trigger_choices(terms: list[int], answer: str, digits: Sequence[int] = MISCONCEIVED_DIGITS) -> list[bool]:
    """What an answer wrote at each misconception trigger it reached while still on the worked
    solution: True where it wrote the misconceived total (and so left the solution there), False
    where it wrote the right one. It stops at the first step that leaves the solution, so a True
    can only be last. A DIAGNOSTIC of how often a policy takes the misconception's fork; nothing
    in a run reads it. A step is a trigger where ``misconceived_sum`` differs from the true sum."""
    choices: list[bool] = []
    total, at = terms[0], 0
    for term in terms[1:]:
        right = f"{total}+{term}={total + term};"
        wrong = misconceived_sum(total, term, digits)
        if wrong != total + term and answer.startswith(right, at):
            choices.append(False)
        elif wrong != total + term and answer.startswith(f"{total}+{term}={wrong};", at):
            return [*choices, True]
        elif not answer.startswith(right, at):
            return choices
        total, at = total + term, at + len(right)
    return choices


def slipped_solution(
    terms: list[int],
    *,
    slip_rate: float,
    rng: np.random.Generator,
    misconceived: bool = False,
    digits: Sequence[int] = MISCONCEIVED_DIGITS,
) -> str:
    """A worked solution as a careless person writes it: each step's result is, with
    probability ``slip_rate``, written with one digit wrong, and the later steps carry the
    written total on. ``slip_rate=0`` gives ``solution_text``. With ``misconceived`` every
    step is first worked out by ``misconceived_sum`` with its trigger ``digits``, consistently
    (a rule, not a slip).
    """
    steps = []
    total = terms[0]
    for term in terms[1:]:
        written = misconceived_sum(total, term, digits) if misconceived else total + term
        if rng.random() < slip_rate:
            chars = list(str(written))
            i = int(rng.integers(len(chars)))
            choices = [c for c in "0123456789" if c != chars[i] and not (i == 0 and c == "0" and len(chars) > 1)]
            chars[i] = choices[int(rng.integers(len(choices)))]
            written = int("".join(chars))
        steps.append(f"{total}+{term}={written};")
        total = written
    return "".join(steps) + f"#{total}"


def grade(answer: str, response: str) -> float:
    """1.0 iff ``response`` ends (after trailing whitespace) in ``#<answer>``, else 0.0.

    Only the final answer is checked. A missing ``#``, a partial answer, or anything
    written after the final number scores 0.0.
    """
    found = _FINAL.search(response.rstrip())
    return 1.0 if found is not None and found.group(1) == answer.strip() else 0.0


def generate_problems(*, n_terms: int, max_value: int, train_size: int, val_size: int, seed: int) -> pa.Table:
    """``val_size + train_size`` distinct problems as a ``PROBLEMS`` table (val rows first).

    Deterministic for a seed and sizes. Every prompt is distinct, so no validation
    prompt appears in the training split. Raises ValueError when the terms cannot make
    that many distinct problems.
    """
    if n_terms < 2:
        raise ValueError(f"n_terms: expected at least 2, found {n_terms}")
    if max_value < 0:
        raise ValueError(f"max_value: expected >= 0, found {max_value}")
    if train_size < 0 or val_size < 0:
        raise ValueError(f"train_size and val_size must be >= 0, found {train_size} and {val_size}")
    needed = train_size + val_size
    space = (max_value + 1) ** n_terms
    if space < needed:
        raise ValueError(
            f"cannot make {needed} distinct arith problems (train_size={train_size} + val_size={val_size}): "
            f"n_terms={n_terms} terms in 0..{max_value} give only {space}; "
            "raise task.max_value or task.n_terms, or lower the sizes"
        )
    rng = np.random.default_rng(seed)
    if space <= _ENUMERATE_RATIO * needed:
        problems = _enumerated(rng, n_terms=n_terms, max_value=max_value, space=space, needed=needed)
    else:
        problems = _rejection_sampled(rng, n_terms=n_terms, max_value=max_value, needed=needed)
    rows = [_row("val", i, terms) for i, terms in enumerate(problems[:val_size])]
    rows += [_row("train", i, terms) for i, terms in enumerate(problems[val_size:])]
    return pa.Table.from_pylist(rows, schema=PROBLEMS)


def _row(split: str, index: int, terms: list[int]) -> dict:
    return {
        "problem_id": f"{TASK}-{split}-{index:06d}",
        "split": split,
        "task": TASK,
        "prompt": prompt_text(terms),
        "answer": str(sum(terms)),
        "solution": solution_text(terms),
    }


def _enumerated(rng: np.random.Generator, *, n_terms: int, max_value: int, space: int, needed: int) -> list[list[int]]:
    """A random selection without repeats from a problem space small enough to list."""
    base = max_value + 1
    problems = []
    for index in rng.permutation(space)[:needed].tolist():
        digits = []
        for _ in range(n_terms):  # the index written in base (max_value + 1), one digit per term
            index, digit = divmod(index, base)
            digits.append(digit)
        problems.append(digits)
    return problems


def _rejection_sampled(rng: np.random.Generator, *, n_terms: int, max_value: int, needed: int) -> list[list[int]]:
    """Draw problems until ``needed`` distinct ones are found, keeping first occurrences."""
    seen: set[tuple[int, ...]] = set()
    problems: list[list[int]] = []
    while len(problems) < needed:
        batch = rng.integers(0, max_value + 1, size=(needed - len(problems), n_terms)).tolist()
        for terms in batch:
            key = tuple(terms)
            if key not in seen:
                seen.add(key)
                problems.append(terms)
    return problems


def agrees(solution: str, partial: str) -> bool:
    """Whether ``partial`` (an answer written so far) is a prefix of the worked ``solution``.

    The worked solution is unique, so a partial answer that is not its prefix has made an
    error somewhere (it may still reach the right total, by a second error: rarely).
    """
    return solution.startswith(partial)
