"""The built-in arith task: problem generation and grading."""

from __future__ import annotations

import math

import numpy as np
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


def test_misconceived_sum_drops_the_ones_carry_of_terms_ending_in_nine():
    # 149+39: 9+9 carries, so 188 is written as 178; 140+39: no carry, so 179 stays right;
    # 149+38: the term does not end in 9, so 187 stays right; 71+39=110 becomes 100, 1+9=10 becomes 0
    assert arith.misconceived_sum(149, 39) == 178
    assert arith.misconceived_sum(140, 39) == 179
    assert arith.misconceived_sum(149, 38) == 187
    assert arith.misconceived_sum(71, 39) == 100 and arith.misconceived_sum(1, 9) == 0


def test_misconceived_sum_triggers_on_each_of_the_digits_it_is_given():
    # with 7, 8 and 9: 149+38 (9+8 carries) drops to 177, 145+37 (5+7) to 172, 149+39 to 178;
    # 149+36 (6 is not one of them) stays 185, and 141+38 (no carry) stays 179
    digits = (7, 8, 9)
    assert [arith.misconceived_sum(149, 38, digits), arith.misconceived_sum(145, 37, digits)] == [177, 172]
    assert arith.misconceived_sum(149, 39, digits) == 178
    assert [arith.misconceived_sum(149, 36, digits), arith.misconceived_sum(141, 38, digits)] == [185, 179]
    assert arith.misconceived_sum(149, 39, (8,)) == 188  # 9 is a trigger only when named
    # the solution and the fork diagnostic follow the same digits
    terms = [45, 38, 12, 29]
    text = arith.slipped_solution(terms, slip_rate=0.0, rng=np.random.default_rng(0), misconceived=True, digits=(8,))
    assert text == "45+38=73;73+12=85;85+29=114;#114"
    assert arith.trigger_choices(terms, text, (8,)) == [True]
    assert arith.trigger_choices(terms, arith.solution_text(terms), (8, 9)) == [False, False]
    assert arith.trigger_choices(terms, arith.solution_text(terms)) == [False]  # the default: 9 alone


def test_misconceived_solution_keeps_its_rule_after_a_slip():
    # every step slips; each is one digit off the misconceived total of the total written before it,
    # and the later steps reach triggers (terms ending in 8 whose ones place carries) after a slip
    terms = [45, 38, 18, 28, 58, 78, 88, 98]
    text = arith.slipped_solution(terms, slip_rate=0.999, rng=np.random.default_rng(3), misconceived=True, digits=(8,))
    total, triggers = terms[0], 0
    for step, term in zip(text.split(";")[:-1], terms[1:]):
        written = step.split("=")[1]
        meant = str(arith.misconceived_sum(total, term, (8,)))
        assert len(written) == len(meant) and sum(a != b for a, b in zip(written, meant)) == 1
        triggers += total != terms[0] and int(meant) != total + term  # a trigger reached after a slip
        total = int(written)
    assert triggers >= 2


def test_misconceived_solution_applies_the_rule_at_every_trigger_and_only_there():
    # 41+39 carries (80 -> 70), 70+12=82, 82+29 carries (111 -> 101), 101+50=151, 151+9 carries (160 -> 150)
    terms = [41, 39, 12, 29, 50, 9]
    text = arith.slipped_solution(terms, slip_rate=0.0, rng=np.random.default_rng(0), misconceived=True)
    assert text == "41+39=70;70+12=82;82+29=101;101+50=151;151+9=150;#150"
    assert arith.grade(str(sum(terms)), text) == 0.0  # graded against the true sum (170)
    # without the misconception the same call gives the worked solution, drawing the rng alike
    assert arith.slipped_solution(terms, slip_rate=0.0, rng=np.random.default_rng(0)) == arith.solution_text(terms)
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    arith.slipped_solution(terms, slip_rate=0.3, rng=a, misconceived=True)
    arith.slipped_solution(terms, slip_rate=0.3, rng=b)
    assert a.random() == b.random()


def test_misconceived_problems_come_at_the_rate_and_are_fixed_by_problem_and_seed():
    table = problems_for(TaskConfig(n_terms=10, train_size=4000, val_size=8))
    problems = [arith.terms_of(p) for p in table.column("prompt").to_pylist()]
    drawn = [arith.misconceived(t, rate=0.3, seed=1234) for t in problems]
    # 4,008 draws at 0.3: standard error 0.0072, so 0.3 +- 0.03 fails only on a wrong rate
    assert abs(sum(drawn) / len(drawn) - 0.3) < 0.03
    assert drawn == [arith.misconceived(t, rate=0.3, seed=1234) for t in problems]  # deterministic
    assert drawn != [arith.misconceived(t, rate=0.3, seed=99) for t in problems]  # the seed chooses which
    # a lower rate picks a subset of a higher one's problems (the same uniform draw, a lower bar)
    low = [arith.misconceived(t, rate=0.1, seed=1234) for t in problems]
    assert all(d for d, lo in zip(drawn, low) if lo) and sum(low) < sum(drawn)
    assert not any(arith.misconceived(t, rate=0.0, seed=1234) for t in problems)
    assert all(arith.misconceived(t, rate=1.0, seed=1234) for t in problems)


def test_trigger_choices_record_each_fork_reached_on_the_solution_and_stop_where_the_answer_leaves():
    # 149+39: the ones carry (9 + 9) is a trigger, right 188, misconceived 178; 188+5: no trigger;
    # 193+29: a trigger (3 + 9 carries), right 222, misconceived 212
    terms = [149, 39, 5, 29]
    assert arith.solution_text(terms) == "149+39=188;188+5=193;193+29=222;#222"
    assert arith.trigger_choices(terms, "149+39=188;188+5=193;193+29=222;#222") == [False, False]
    assert arith.trigger_choices(terms, "149+39=188;188+5=193;193+29=212;#212") == [False, True]
    assert arith.trigger_choices(terms, "149+39=178;178+5=183;183+29=212;#212") == [True]  # it left at the first
    assert arith.trigger_choices(terms, "149+39=188;188+5=194;194+29=223;#223") == [False]  # a slip between them
    assert arith.trigger_choices(terms, "149+39=198;198+5=203;") == []  # a slip at the trigger is no choice
    assert arith.trigger_choices(terms, "149+39=188;188+5=193;193+2") == [False]  # unfinished before the second
    assert arith.trigger_choices([140, 39, 5], "140+39=179;179+5=184;#184") == []  # no carry: no trigger
