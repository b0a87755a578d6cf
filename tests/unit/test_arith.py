"""The built-in arith task: problem generation and grading."""

from __future__ import annotations

import math

import pytest

from ac2_core.config import TaskConfig
from ac2_core.models.tokenizer import build_tokenizer
from ac2_core.schemas import PROBLEMS
from ac2_core.tasks import arith, grade, problems_for
from ac2_core.tasks.arith import generate_problems, solution_text


def _small(**overrides):
    kwargs = {"n_terms": 6, "max_value": 99, "train_size": 200, "val_size": 20, "seed": 7} | overrides
    return generate_problems(**kwargs)


def test_solution_writes_every_running_sum():
    # 49+97=146, 146+53=199, 199+12=211, 211+8=219, 219+77=296
    assert solution_text([49, 97, 53, 12, 8, 77]) == "49+97=146;146+53=199;199+12=211;211+8=219;219+77=296;#296"


def test_rows_match_schema_and_are_consistent():
    table = _small()
    assert table.schema.equals(PROBLEMS)
    assert table.num_rows == 220
    for row in table.to_pylist():
        terms = [int(t) for t in row["prompt"].rstrip("\n").split("+")]
        assert row["prompt"].endswith("\n") and len(terms) == 6
        assert all(0 <= t <= 99 for t in terms)
        assert row["answer"] == str(sum(terms))
        assert row["solution"] == solution_text(terms)
        assert row["task"] == "arith"
        assert grade("arith", row["answer"], row["solution"]) == 1.0


def test_same_seed_same_problems_other_seed_others():
    assert _small().equals(_small())
    assert not _small().column("prompt").equals(_small(seed=8).column("prompt"))


def test_ids_are_readable_and_splits_disjoint():
    rows = _small().to_pylist()
    train = [r for r in rows if r["split"] == "train"]
    val = [r for r in rows if r["split"] == "val"]
    assert [r["problem_id"] for r in train[:2]] == ["arith-train-000000", "arith-train-000001"]
    assert val[3]["problem_id"] == "arith-val-000003"
    assert (len(train), len(val)) == (200, 20)
    assert len({r["problem_id"] for r in rows}) == len(rows)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}


def test_tiny_space_is_used_exactly_without_repeats():
    # 2 terms in 0..2: 9 distinct problems, all of them asked for.
    rows = generate_problems(n_terms=2, max_value=2, train_size=6, val_size=3, seed=0).to_pylist()
    assert len({r["prompt"] for r in rows}) == 9


def test_impossible_sizes_raise_naming_the_sizes():
    with pytest.raises(ValueError, match=r"train_size=8 \+ val_size=2.*only 9"):
        generate_problems(n_terms=2, max_value=2, train_size=8, val_size=2, seed=0)


def test_problems_for_default_config():
    cfg = TaskConfig(train_size=64, val_size=8)
    table = problems_for(cfg)
    assert table.num_rows == 72
    assert table.equals(generate_problems(n_terms=6, max_value=99, train_size=64, val_size=8, seed=cfg.seed))


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("49+97=146;146+53=199;199+12=211;211+8=219;219+77=296;#296", 1.0),
        ("49+97=146;146+53=199;199+12=211;211+8=219;219+77=296;#296  \n", 1.0),  # trailing whitespace
        ("#296", 1.0),  # only the final answer is graded
        ("49+97=146;146+53=199;199+12=211;211+8=219;219+77=296;#297", 0.0),  # wrong
        ("49+97=146;146+53=199;199+12=211;211+8=219;219+77=296;", 0.0),  # partial: no '#'
        ("49+97=146;146+53=199;199+12=2", 0.0),  # cut mid-answer
        ("49+97=146;146+53=199;199+12=211;211+8=219;219+77=296;#2", 0.0),  # final number cut short
        ("219+77=296;#296;", 0.0),  # text after the final number
        ("219+77=296;#296x", 0.0),
        ("219+77=296;#296 #1", 0.0),  # the last '#' decides
        ("#0296", 0.0),
        ("", 0.0),
        ("#", 0.0),
    ],
)
def test_grader(response, expected):
    score = grade("arith", "296", response)
    assert score == expected
    assert isinstance(score, float) and math.isfinite(score)


def test_grade_rejects_unknown_task_and_missing_answer():
    with pytest.raises(ValueError, match="'proofs'"):
        grade("proofs", "1", "#1")
    with pytest.raises(ValueError, match="answer"):
        grade("arith", None, "#1")


def test_answers_span_more_than_three_chunks_of_16_tokens():
    table = problems_for(TaskConfig(train_size=256, val_size=8))
    tokenizer = build_tokenizer(table.column("solution").to_pylist())
    lengths = [len(tokenizer.encode(s, add_special_tokens=False)) + 1 for s in table.column("solution").to_pylist()]
    assert sum(lengths) / len(lengths) > 3 * 16  # solution + eos; about 57 tokens


def test_slipped_solution_carries_each_slip_on():
    import numpy as np

    terms = [49, 97, 53, 12]
    assert arith.slipped_solution(terms, slip_rate=0.0, rng=np.random.default_rng(0)) == arith.solution_text(terms)
    text = arith.slipped_solution(terms, slip_rate=0.999, rng=np.random.default_rng(0))
    steps, final = text.split(";")[:-1], text.split("#")[1]
    total = terms[0]
    for step, term in zip(steps, terms[1:]):
        left, written = step.split("=")
        assert left == f"{total}+{term}"  # each step starts from the total written before it
        right = str(total + term)
        assert len(written) == len(right) and sum(a != b for a, b in zip(written, right)) == 1  # one digit off
        total = int(written)
    assert final == str(total) and arith.terms_of(arith.prompt_text(terms)) == terms
