"""Problem sources and graders. A problem's ``task`` column picks its grader.

=====  ==========================================  ==============================
task   problems                                    grader
=====  ==========================================  ==============================
arith  built in (``tasks.arith``)                  rule: the final ``#sum``
math   a file of shape final_answer (``loaders``)  final answer, math-verify
proof  a file of shape fineproofs or proofbench    rubric judge over HTTP (0-7)
=====  ==========================================  ==============================

Stages grade a batch at once (``grade_many``): rule graders row by row, the judge
concurrently. A judgement that fails (endpoint down, timeouts, no readable score) is a
``Grade`` with ``reward=None`` and the reason; the stages mask it out, never score it 0.
A rule grader that returns anything but a number in [0, 1] is a bug, and raises.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from ac2_core.config import TaskConfig
from ac2_core.schemas import PROBLEMS
from ac2_core.tasks import arith, math_answer
from ac2_core.tasks.loaders import DataError

log = logging.getLogger(__name__)

JUDGED = "proof"  # the task whose rewards come from the rubric judge
THINK_END = "</think>"


@dataclass(frozen=True)
class Grade:
    """``reward`` in [0, 1], or None with ``error`` saying why no grade was obtained."""

    reward: float | None
    error: str | None = None


def _rule_score(task: str, answer: str | None, response: str) -> float:
    match task:
        case "arith" | "math":
            if answer is None:
                raise ValueError(f"task {task!r} needs an answer to grade against, found none")
            return arith.grade(answer, response) if task == "arith" else math_answer.grade(answer, response)
        case "proof":
            raise ValueError("task 'proof' is graded by the rubric judge, over a batch: use grade_many")
        case _:
            raise ValueError(f"unknown task {task!r}; known tasks: arith, math, proof")


def _checked(task: str, score, what: str) -> float:
    if not isinstance(score, (int, float)) or not (math.isfinite(score) and 0.0 <= score <= 1.0):
        raise ValueError(f"grader {task!r} returned {score!r} for {what}; rewards must be finite numbers in [0, 1]")
    return float(score)


def grade(task: str, answer: str | None, response: str) -> float:
    """The reward ``R(x, y)`` in [0, 1] of ``response`` under a rule grader (arith, math)."""
    return _checked(task, _rule_score(task, answer, response), "a response")


def answer_part(response: str) -> str:
    """What a grader reads: the text after the last ``</think>`` (Qwen3's reasoning is not the proof)."""
    end = response.rfind(THINK_END)
    return response[end + len(THINK_END) :] if end >= 0 else response


def judge_item(problem: dict, response: str):
    """The rubric judge's input for ``response`` to ``problem`` (a PROBLEMS row with metadata)."""
    from ac2_core.tasks.judge import JudgeItem  # HTTP client: only proof tasks need it

    pid = problem["problem_id"]
    try:
        meta = json.loads(problem.get("metadata") or "null")
    except ValueError:
        raise ValueError(f"problem {pid}: column 'metadata' is not JSON") from None
    if not isinstance(meta, dict) or not (meta.get("rubrics") or meta.get("guidelines")):
        raise ValueError(
            f"problem {pid}: task 'proof' needs rubrics or grading guidelines in its metadata, found {str(meta)[:80]}"
        )
    return JudgeItem(
        problem=problem["prompt"],
        proof=answer_part(response),
        rubrics=tuple(meta.get("rubrics") or ()),
        guidelines=meta.get("guidelines"),
        reference_solution=problem.get("solution"),
    )


def grade_many(cfg: TaskConfig, problems: Sequence[dict], responses: Sequence[str], labels: Sequence[str]) -> list[Grade]:
    """One ``Grade`` per (problem row, response); ``labels`` name each response in errors.

    Rule graders run in order; proof responses go to the judge (``cfg.judge``) together,
    at most ``judge.max_concurrency`` at once. Judge failures come back as ungraded.
    """
    if not len(problems) == len(responses) == len(labels):
        raise ValueError(f"grade_many: {len(problems)} problems, {len(responses)} responses, {len(labels)} labels")
    grades: list[Grade | None] = [None] * len(responses)
    judged = []
    for i, (p, response, label) in enumerate(zip(problems, responses, labels)):
        if p["task"] == JUDGED:
            judged.append((i, judge_item(p, response)))
        else:
            what = f"{label} (problem {p['problem_id']})"
            grades[i] = Grade(_checked(p["task"], _rule_score(p["task"], p["answer"], response), what))
    if judged:
        from ac2_core.tasks.judge import RubricJudge

        if cfg.judge is None:
            raise ValueError("problems of task 'proof' need task.judge (base_url, model) to be graded")
        judgements = RubricJudge(cfg.judge).judge_many([item for _, item in judged])
        failed = [j.error for j in judgements if j.score is None]
        if failed:
            log.warning("judge: %d of %d judgements failed (masked, not scored); first: %s", len(failed), len(judged), failed[0])
        for (i, _), j in zip(judged, judgements):
            grades[i] = Grade(j.score) if j.score is not None else Grade(None, j.error or "no score")
    return grades


def problems_for(cfg: TaskConfig) -> pa.Table:
    """The problem set (``PROBLEMS`` schema) that ``cfg`` describes: built in, or loaded from ``cfg.data``."""
    match cfg.name:
        case "arith":
            return arith.generate_problems(
                n_terms=cfg.n_terms,
                max_value=cfg.max_value,
                train_size=cfg.train_size,
                val_size=cfg.val_size,
                seed=cfg.seed,
            )
        case "math" | "proof":
            return _loaded(cfg)
        case _:
            raise ValueError(f"task.name: unknown task {cfg.name!r}; known tasks: arith, math, proof")


def built_in_answer_tokens(cfg: TaskConfig) -> float | None:
    """Mean tokens of a worked solution plus eos for the built-in task (one token per character
    with the tiny model's tokenizer); None for loaded data, whose answers are not known before sampling."""
    if cfg.name != "arith":
        return None
    solutions = problems_for(cfg).column("solution").to_pylist()
    return sum(len(s) + 1 for s in solutions) / len(solutions)


def _loaded(cfg: TaskConfig) -> pa.Table:
    """``cfg.data``, split by ``val_fraction``; or, with ``cfg.val_data``, data for training
    and val_data for validation, less any training problem whose text is also in val_data."""
    from ac2_core.tasks.loaders import load_problems, normal_text

    def load(uri, shape, fmt, columns, val_fraction, filtered):
        return load_problems(
            uri,
            task=cfg.name,
            shape=shape,
            fmt=fmt,
            columns=columns.model_dump(),
            val_fraction=val_fraction,
            seed=cfg.seed,
            min_reward_mean=cfg.min_reward_mean if filtered else None,
            max_reward_mean=cfg.max_reward_mean if filtered else None,
        )

    loaded = load(cfg.data, cfg.shape, cfg.format, cfg.columns, cfg.val_fraction, True)
    rows, metadata = loaded.table.to_pylist(), dict(loaded.metadata)
    if cfg.val_data:
        held_out = load(cfg.val_data, cfg.val_shape, "auto", cfg.val_columns, 0.0, False)
        val = [dict(r, split="val") for r in held_out.table.to_pylist()]
        texts = {normal_text(r["prompt"]) for r in val}
        train = [r for r in rows if normal_text(r["prompt"]) not in texts]  # no problem on both sides
        if len(train) < len(rows):
            log.info("task.data: %d problems also in task.val_data left out of training", len(rows) - len(train))
        clash = {r["problem_id"] for r in train} & {r["problem_id"] for r in val}
        if clash:
            raise DataError(f"task.data and task.val_data share problem ids with different texts: {sorted(clash)[:5]}")
        rows = val + train
        metadata.update(held_out.metadata)
    for split in ("train", "val"):
        if not any(r["split"] == split for r in rows):
            raise DataError(
                f"task.data {cfg.data}: no problem fell in the {split} split ({len(rows)} problems,"
                f" task.val_fraction {cfg.val_fraction}, task.val_data {cfg.val_data}); change them or add problems"
            )
    for r in rows:
        r["metadata"] = json.dumps(metadata[r["problem_id"]], sort_keys=True, ensure_ascii=False, default=_plain)
    return pa.Table.from_pylist(rows, schema=PROBLEMS)


def _plain(value):
    """JSON form of pass-through values that json cannot write itself (numpy scalars and arrays)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"metadata value of type {type(value).__name__} cannot be written as JSON")
