"""Problem sources and graders. A problem's ``task`` column picks its grader."""

from __future__ import annotations

import math

import pyarrow as pa

from ac2_core.config import TaskConfig
from ac2_core.tasks import arith


def grade(task: str, answer: str | None, response: str) -> float:
    """The reward ``R(x, y)`` in [0, 1] of ``response`` to a problem of ``task``."""
    match task:
        case "arith":
            if answer is None:
                raise ValueError("task 'arith' needs an answer to grade against, found none")
            score = arith.grade(answer, response)
        case _:
            raise ValueError(f"unknown task {task!r}; known tasks: arith")
    if not (math.isfinite(score) and 0.0 <= score <= 1.0):
        raise ValueError(f"grader of task {task!r} returned {score!r}, expected a number in [0, 1]")
    return float(score)


def problems_for(cfg: TaskConfig) -> pa.Table:
    """The built-in problem set (``PROBLEMS`` schema) that ``cfg`` describes."""
    match cfg.name:
        case "arith":
            return arith.generate_problems(
                n_terms=cfg.n_terms,
                max_value=cfg.max_value,
                train_size=cfg.train_size,
                val_size=cfg.val_size,
                seed=cfg.seed,
            )
        case "fineproofs":
            raise NotImplementedError(
                f"task.name: fineproofs ({cfg.data}) needs the proof-data loader and rubric judge, which are not built yet"
            )
        case _:
            raise ValueError(f"task.name: unknown task {cfg.name!r}; known tasks: arith")
