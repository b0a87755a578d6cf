"""Final-answer extraction and equivalence (ac2_core.tasks.math_answer), through math-verify."""

from __future__ import annotations

import threading

import pytest

from ac2_core.tasks import math_answer as ma

pytest.importorskip("math_verify")


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (r"so the answer is \boxed{42}.", "42"),
        (r"first \boxed{1} then, correcting, \boxed{2}", "2"),  # the last one counts
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces
        (r"\boxed{\left\{1, 2\right\}}", r"\left\{1, 2\right\}"),  # escaped braces are not structure
        (r"\fbox{7}", "7"),
        (r"\boxed{3} and then an unfinished \boxed{\frac{1}{", "3"),  # an unclosed box is skipped
        ("step one\n#### 18\n", "18"),
        ("Thus the final answer is $x = 5$.", "x = 5"),
        ("Work...\nAnswer: 12", "12"),
        ("no answer here at all", None),
        ("", None),
        (r"\boxed{}", None),
    ],
)
def test_extract_answer(response, expected):
    assert ma.extract_answer(response) == expected


@pytest.mark.parametrize(
    ("answer", "response", "reward"),
    [
        (r"\frac{1}{2}", r"The probability is \boxed{0.5}.", 1.0),
        ("0.5", r"\boxed{\frac{1}{2}}", 1.0),
        (r"2\sqrt{2}", r"hence $d = \boxed{\sqrt{8}}$", 1.0),
        ("42", r"\boxed{42}", 1.0),
        ("42", r"\boxed{43}", 0.0),  # wrong
        (r"\frac{1}{2}", r"\boxed{\frac{1}{3}}", 0.0),  # wrong
        ("42", "I think it is 42 but I will not box it", 0.0),  # no final answer
        ("42", r"\boxed{\frac{{{}", 0.0),  # unbalanced
        ("42", "\x00\xff" * 50 + r"\boxed{\\\\}}}{{", 0.0),  # garbage
        ("42", r"\boxed{" + "(" * 2000 + "}", 0.0),  # too long: refused without parsing
        ("42", "#### 42", 1.0),  # GSM8K style fallback
    ],
)
def test_grade(answer, response, reward):
    assert ma.grade(answer, response) == reward


def test_grade_never_raises_on_odd_input():
    for response in [None, 12, r"\boxed{\sqrt{}}", r"\boxed{1/0}", r"\boxed{\int}", "}" * 100, r"\boxed{x^{y^{z^{w}}}"]:
        assert ma.grade("1", response) in (0.0, 1.0)  # type: ignore[arg-type]


def test_grade_off_the_main_thread():
    # math-verify's SIGALRM timeout only works on the main thread; grading must still work elsewhere
    out: list[float] = []
    t = threading.Thread(target=lambda: out.append(ma.grade(r"\frac{1}{2}", r"\boxed{0.5}")))
    t.start()
    t.join(30)
    assert out == [1.0]
