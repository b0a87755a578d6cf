"""The rubric judge: a proof graded 0-7 by an OpenAI-compatible chat endpoint.

A judgement sends the problem, the rubric or grading guidelines, the reference
solution when there is one, and the candidate proof to ``<base_url>/chat/completions``,
and reads a 0-7 score from the reply (``parse_score``). Reward = points / 7.

A judgement that fails (endpoint down, timeouts past ``max_attempts``, a reply with no
readable score) is returned as a ``Judgement`` with ``score=None`` and the reason in
``error``; it is never turned into a 0, because a 0 would teach the policy that the
proof was wrong. Timeouts, connection errors, 429 and 5xx are retried with doubling
backoff; other 4xx and unreadable scores are not (another try would meet them again).
The API key comes from the environment variable that ``judge.api_key_env`` names and
is sent only in the Authorization header, never logged.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ac2_core.config import JudgeConfig

log = logging.getLogger(__name__)

MAX_POINTS = 7

SYSTEM_PROMPT = (
    "You are an expert olympiad grader. Grade the candidate proof on a 0-7 scale, following the "
    "rubric or grading guidelines exactly. Check every step; an unjustified claim earns no credit. "
    "Explain briefly, then end your reply with the score on its own line as <score>N</score>, "
    "where N is an integer from 0 to 7."
)


@dataclass(frozen=True)
class JudgeItem:
    """One proof to grade. ``rubrics``: checkpoints (may be empty when ``guidelines`` is given)."""

    problem: str
    proof: str
    rubrics: Sequence[str] = ()
    guidelines: str | None = None
    reference_solution: str | None = None


@dataclass(frozen=True)
class Judgement:
    """``score`` in [0, 1] (points / 7), or None with ``error`` set when no score was obtained."""

    score: float | None
    points: int | None
    error: str | None
    raw: str  # the judge's reply ("" when none came)
    attempts: int  # HTTP requests made


class ScoreParseError(ValueError):
    """A judge reply without one readable score in 0..7."""


# ---------------------------------------------------------------------- prompt


def build_messages(item: JudgeItem) -> list[dict[str, str]]:
    """The chat messages of one judgement."""
    parts = [f"## Problem\n{item.problem.strip()}"]
    if item.reference_solution:
        parts.append(f"## Reference solution\n{item.reference_solution.strip()}")
    if item.rubrics:
        lines = "\n".join(f"{i}. {r.strip()}" for i, r in enumerate(item.rubrics, start=1))
        parts.append(f"## Rubric (checkpoints)\n{lines}")
    if item.guidelines:
        parts.append(f"## Grading guidelines\n{item.guidelines.strip()}")
    parts.append(f"## Candidate proof\n{item.proof.strip()}")
    parts.append("Grade the candidate proof from 0 to 7. End with <score>N</score>.")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]


# ---------------------------------------------------------------------- score parsing

_NUM = r"([+-]?\d+(?:\.\d+)?)"
# Tried in order; the first pattern that matches decides (it must then give one value).
_PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    ("<score> tag", re.compile(r"<score>\s*\**\s*" + _NUM + r"\s*(?:/\s*(\d+))?\s*\**\s*</score>", re.IGNORECASE)),
    ("boxed score", re.compile(r"\\boxed\{\s*" + _NUM + r"\s*(?:/\s*(\d+))?\s*\}")),
    (
        "final score label",
        re.compile(r"final\s+(?:score|grade|mark)\s*\**\s*[:=]?\s*\**\s*" + _NUM + r"\s*(?:/\s*(\d+)|out of\s+(\d+))?", re.I),
    ),
    (
        "score label",
        re.compile(r"(?:score|grade|mark|points)\s*\**\s*[:=]\s*\**\s*" + _NUM + r"\s*(?:/\s*(\d+)|out of\s+(\d+))?", re.I),
    ),
    ("N/7", re.compile(_NUM + r"\s*(?:/|out of)\s*(7)\b", re.I)),
    ("bold number", re.compile(r"\*\*\s*" + _NUM + r"\s*\*\*")),
)
_INT_ANY = re.compile(r"[+-]?\d+(?:\.\d+)?")


def _value(number: str, denominator: str | None, how: str) -> int:
    if denominator is not None and int(denominator) != MAX_POINTS:
        raise ScoreParseError(f"{how}: score out of {denominator}, expected out of {MAX_POINTS}")
    if not re.fullmatch(r"[+-]?\d+", number):
        if float(number).is_integer():
            number = str(int(float(number)))
        else:
            raise ScoreParseError(f"{how}: score {number} is not a whole number")
    points = int(number)
    if not 0 <= points <= MAX_POINTS:
        raise ScoreParseError(f"{how}: score {points} is outside 0..{MAX_POINTS}")
    return points


def parse_score(reply: str) -> int:
    """The 0-7 score written in a judge reply. Raises ScoreParseError when there is none,
    several disagreeing ones, or one out of range.

    Tried in order: ``<score>N</score>``, ``\\boxed{N}``, ``Final score: N``,
    ``Score: N`` (``/7`` or ``out of 7`` allowed), ``N/7``, ``**N**``, and last the final
    non-empty line when it holds exactly one number.
    """
    if not isinstance(reply, str) or not reply.strip():
        raise ScoreParseError("empty reply")
    for how, pattern in _PATTERNS:
        found = pattern.findall(reply)
        if not found:
            continue
        values = []
        for groups in found:
            groups = (groups,) if isinstance(groups, str) else groups
            denominator = next((g for g in groups[1:] if g), None)
            values.append(_value(groups[0], denominator, how))
        if len(set(values)) > 1:
            raise ScoreParseError(f"{how}: ambiguous, several scores {values}")
        return values[0]
    last_line = [line for line in reply.strip().splitlines() if line.strip()][-1]
    numbers = _INT_ANY.findall(last_line)
    if len(numbers) == 1:
        return _value(numbers[0], None, "last line")
    if len(numbers) > 1:
        raise ScoreParseError(f"last line: ambiguous, several numbers {numbers}")
    raise ScoreParseError("no score found")


# ---------------------------------------------------------------------- HTTP


class _Retryable(Exception):
    pass


class RubricJudge:
    """Grades proofs through one endpoint (``cfg.task.judge``). Thread-safe."""

    def __init__(self, section: JudgeConfig):
        self.section = section
        self.url = f"{section.base_url}/chat/completions"
        self._api_key = None
        if section.api_key_env is not None:
            self._api_key = os.environ.get(section.api_key_env)
            if not self._api_key:
                raise ValueError(f"task.judge.api_key_env: environment variable {section.api_key_env} is not set or empty")

    def __repr__(self) -> str:  # never shows the key
        return f"RubricJudge(url={self.url!r}, model={self.section.model!r})"

    def judge(self, item: JudgeItem) -> Judgement:
        """One judgement; never raises on endpoint or reply trouble (see ``Judgement.error``)."""
        body = json.dumps(
            {
                "model": self.section.model,
                "messages": build_messages(item),
                "temperature": self.section.temperature,
                "max_tokens": self.section.max_tokens,
            }
        ).encode()
        s = self.section
        error = "no attempt made"
        for attempt in range(1, s.max_attempts + 1):
            if attempt > 1:
                time.sleep(s.backoff_seconds * 2 ** (attempt - 2))
            try:
                raw = self._post(body)
            except _Retryable as e:
                error = str(e)
                log.warning("judge %s: attempt %d/%d failed: %s", self.url, attempt, s.max_attempts, error)
                continue
            except RuntimeError as e:
                return Judgement(None, None, str(e), "", attempt)
            try:
                points = parse_score(raw)
            except ScoreParseError as e:
                return Judgement(None, None, f"unreadable score: {e}", raw, attempt)
            return Judgement(points / MAX_POINTS, points, None, raw, attempt)
        return Judgement(None, None, f"gave up after {s.max_attempts} attempts: {error}", "", s.max_attempts)

    def judge_many(self, items: Sequence[JudgeItem]) -> list[Judgement]:
        """Judgements of ``items``, in order, at most ``max_concurrency`` requests in flight."""
        if not items:
            return []
        with ThreadPoolExecutor(max_workers=min(self.section.max_concurrency, len(items))) as pool:
            return list(pool.map(self.judge, items))

    def _post(self, body: bytes) -> str:
        """The reply text. Raises _Retryable for transient trouble, RuntimeError otherwise."""
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.section.timeout_seconds) as response:
                payload = response.read()
        except urllib.error.HTTPError as e:
            if e.code == 429 or e.code >= 500:
                raise _Retryable(f"HTTP {e.code} from {self.url}") from None
            raise RuntimeError(f"HTTP {e.code} from {self.url}: {e.read()[:200]!r}") from None
        except TimeoutError:
            raise _Retryable(f"no reply from {self.url} within {self.section.timeout_seconds} s") from None
        except (urllib.error.URLError, ConnectionError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, TimeoutError):
                raise _Retryable(f"no reply from {self.url} within {self.section.timeout_seconds} s") from None
            raise _Retryable(f"cannot reach {self.url}: {reason}") from None
        try:
            content = json.loads(payload)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            # a proxy's error page or a truncated body: another try may get a real reply
            raise _Retryable(f"malformed response from {self.url}: {payload[:120]!r}") from None
        if not isinstance(content, str):
            raise _Retryable(f"malformed response from {self.url}: content is {type(content).__name__}")
        return content
