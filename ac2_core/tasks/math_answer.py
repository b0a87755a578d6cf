"""Final-answer math: take the model's final answer and check it against the reference.

The final answer is the content of the **last** ``\\boxed{...}`` (or ``\\fbox{...}``) in
the response, read with balanced braces so that ``\\boxed{\\frac{1}{2}}`` gives
``\\frac{1}{2}``. Without a boxed answer these fallbacks are tried, in order, each on
its last occurrence:

1. ``#### <answer>`` on a line of its own (GSM8K style);
2. ``final answer is <answer>`` / ``final answer: <answer>`` (to the end of its line,
   ``$`` and a trailing period removed);
3. ``Answer: <answer>`` at the start of a line.

Equivalence is decided by ``math-verify`` (``parse`` then ``verify``), so ``\\frac{1}{2}``
matches ``0.5`` and ``2\\sqrt{2}`` matches ``\\sqrt{8}``; identical strings match without
it. Model output is untrusted: ``grade`` never raises on it and returns 0.0 for
anything it cannot read.
"""

from __future__ import annotations

import logging
import re
import threading

log = logging.getLogger(__name__)

TASK = "math"

# Longer extracted answers are refused: sympy can take minutes on a pathological
# expression, and no reference answer in a math data set is this long.
MAX_ANSWER_CHARS = 500
# math-verify's own timeout uses SIGALRM, which only the main thread may set.
_PARSE_TIMEOUT_SECONDS = 5

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASHES = re.compile(r"^\s*####\s*(.+?)\s*$", re.MULTILINE)
_FINAL_IS = re.compile(r"final answer\s*(?:is|:)\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_ANSWER_LINE = re.compile(r"^\s*\**answer\**\s*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)


def _balanced(text: str, start: int) -> str | None:
    """The text from ``start`` up to the brace closing the one just before it, or None."""
    depth = 1
    for i in range(start, len(text)):
        c = text[i]
        if c == "{" and text[i - 1] != "\\":
            depth += 1
        elif c == "}" and text[i - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}``/``\\fbox{...}``, or None."""
    for match in reversed(list(_BOX.finditer(text))):
        content = _balanced(text, match.end())
        if content is not None:
            return content.strip()
    return None


def _clean(answer: str) -> str:
    answer = answer.strip()
    answer = answer[:-1] if answer.endswith(".") else answer
    return answer.strip().strip("$").strip()


def extract_answer(response: str) -> str | None:
    """The final answer written in ``response`` (see the module docstring), or None."""
    if not isinstance(response, str) or not response.strip():
        return None
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed or None
    for pattern in (_HASHES, _FINAL_IS, _ANSWER_LINE):
        found = pattern.findall(response)
        if found:
            boxed_inside = last_boxed(found[-1])
            answer = _clean(boxed_inside if boxed_inside is not None else found[-1])
            return answer or None
    return None


def _normal(s: str) -> str:
    return re.sub(r"\s+", "", s).strip("$")


def equivalent(reference: str, candidate: str) -> bool:
    """True iff ``candidate`` is mathematically equal to ``reference`` (math-verify)."""
    if _normal(reference) == _normal(candidate):
        return True
    from math_verify import parse, verify  # imported here: only this task needs it

    timeout = _PARSE_TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"${reference}$", parsing_timeout=timeout)
    pred = parse(f"${candidate}$", parsing_timeout=timeout)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


def grade(answer: str, response: str) -> float:
    """1.0 iff the final answer of ``response`` equals ``answer``, else 0.0. Never raises on ``response``."""
    candidate = extract_answer(response)
    if candidate is None or len(candidate) > MAX_ANSWER_CHARS:
        return 0.0
    try:
        return 1.0 if equivalent(answer, candidate) else 0.0
    except Exception as e:  # noqa: BLE001 - any failure to read model output is a wrong answer
        log.debug("math answer %r not comparable with %r: %s", candidate[:80], answer[:80], e)
        return 0.0
