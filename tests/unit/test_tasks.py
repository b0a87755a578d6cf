"""The task layer (ac2_core.tasks): config checks, loaded problem sets with metadata, batch grading."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ac2_core.config import ConfigError, TaskConfig, parse_config
from ac2_core.schemas import PROBLEMS
from ac2_core.tasks import Grade, answer_part, grade, grade_many, judge_item, problems_for
from ac2_core.tasks.loaders import DataError

JUDGE = {"base_url": "http://127.0.0.1:9/v1", "model": "j"}


def _task_error(task: dict) -> str:
    with pytest.raises(ConfigError) as e:
        parse_config({"task": task})
    return str(e.value)


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ({"name": "proof", "judge": JUDGE}, "task.data: data is required for task proof"),
        ({"name": "math", "shape": "final_answer"}, "task.data: data is required for task math"),
        ({"name": "proof", "data": "x.parquet"}, "task.judge: judge is required for task proof"),
        ({"name": "math", "data": "x.jsonl"}, "task.shape: shape must be final_answer for task math"),
        ({"name": "proof", "data": "x", "shape": "final_answer", "judge": JUDGE}, "task.shape: shape must be fineproofs or"),
        ({"name": "arith", "judge": JUDGE}, "task.judge: judge is used only by task proof"),
        ({"name": "proof", "data": "x", "judge": {"base_url": "http://h/v1"}}, "task.judge.model: Field required"),
        ({"name": "proof", "data": "x", "judge": {"model": "m"}}, "task.judge.base_url: Field required"),
        ({"name": "fineproofs", "data": "x"}, "task.name: Input should be 'arith', 'math' or 'proof'"),
        ({"val_data": "v.jsonl", "val_fraction": 0}, "task.val_data: val_data is for tasks that load data"),
        ({"name": "proof", "data": "x", "judge": JUDGE, "val_data": "v"}, "task.val_fraction: val_fraction must be 0 when"),
        (
            {"name": "math", "data": "x", "shape": "final_answer", "val_data": "v", "val_fraction": 0},
            "task.val_shape: val_shape proofbench does not fit task math",
        ),
    ],
)
def test_task_config_errors_name_the_field(task, expected):
    assert expected in _task_error(task)


def test_proof_config_survives_its_json_form():
    cfg = parse_config({"task": {"name": "proof", "data": "x.parquet", "judge": JUDGE}})
    assert parse_config(json.loads(cfg.to_json())) == cfg
    assert parse_config({}).task.judge is None  # arith carries no judge section


def _fineproofs(tmp_path, rows=None):
    rows = rows or [
        {
            "problem": f"Prove that {i} + {i} is even.",
            "source": "olympiad",
            "rubrics": ["Writes 2k (2 pts)", "Concludes (5 pts)"],
            "scores": [7, 0],
            "reward_mean": 0.5,
        }
        for i in range(20)
    ]
    path = tmp_path / "fp.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_loaded_proof_problems_carry_their_rubrics_as_json(tmp_path):
    cfg = TaskConfig(name="proof", data=_fineproofs(tmp_path), val_fraction=0.3, judge=JUDGE)
    table = problems_for(cfg)
    assert table.schema == PROBLEMS
    rows = table.to_pylist()
    assert len(rows) == 20 and {r["task"] for r in rows} == {"proof"}
    assert {r["split"] for r in rows} == {"train", "val"}
    meta = json.loads(rows[0]["metadata"])
    assert meta["rubrics"] == ["Writes 2k (2 pts)", "Concludes (5 pts)"]
    assert meta["source"] == "olympiad" and meta["scores"] == [7, 0]
    assert problems_for(cfg).equals(table)  # deterministic


def test_a_split_left_empty_is_a_clear_error(tmp_path):
    cfg = TaskConfig(name="proof", data=_fineproofs(tmp_path), val_fraction=0.0, judge=JUDGE)
    with pytest.raises(DataError, match=r"no problem fell in the val split \(20 problems, task.val_fraction 0.0,"):
        problems_for(cfg)


def test_a_separate_validation_file(tmp_path):
    # train: FineProofs-RL; validation: IMO-ProofBench style, one problem also in the train file
    bench = [
        {
            "Problem ID": f"PB-{i}",
            "Problem": f"Prove that  {i} + {i} is even." if i == 3 else f"Show that {i}^2 >= 0.",
            "Solution": f"Reference {i}.",
            "Grading guidelines": "7 for a complete proof.",
            "Source": "IMO-ProofBench",
        }
        for i in range(4)
    ]
    val_path = tmp_path / "bench.jsonl"
    val_path.write_text("".join(json.dumps(r) + "\n" for r in bench))
    cfg = TaskConfig(name="proof", data=_fineproofs(tmp_path), val_data=str(val_path), val_fraction=0, judge=JUDGE)
    rows = problems_for(cfg).to_pylist()
    val = [r for r in rows if r["split"] == "val"]
    train = [r for r in rows if r["split"] == "train"]
    assert [r["problem_id"] for r in val] == ["PB-0", "PB-1", "PB-2", "PB-3"]
    assert len(train) == 19 and "Prove that 3 + 3 is even." not in {r["prompt"] for r in train}
    item = judge_item(val[1], "A proof.")
    assert (item.guidelines, item.reference_solution, item.rubrics) == ("7 for a complete proof.", "Reference 1.", ())


def test_bad_rows_stop_the_load_with_file_row_and_column(tmp_path):
    rows = [{"problem": "P", "rubrics": ["a"]}, {"problem": None, "rubrics": ["a"]}]
    cfg = TaskConfig(name="proof", data=_fineproofs(tmp_path, rows), judge=JUDGE)
    with pytest.raises(DataError, match=r"fp.parquet: row 1: column 'problem': missing problem"):
        problems_for(cfg)


def test_math_problems_are_graded_by_their_final_answer(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"problem": f"{i}/2?", "answer": f"\\frac{{{i}}}{{2}}"}) + "\n" for i in range(1, 9)))
    cfg = TaskConfig(name="math", data=str(path), shape="final_answer", val_fraction=0.4)
    rows = problems_for(cfg).to_pylist()
    three = next(r for r in rows if r["prompt"] == "3/2?")
    assert three["task"] == "math" and three["answer"] == "\\frac{3}{2}"
    grades = grade_many(cfg, [three] * 3, ["so \\boxed{1.5}", "\\boxed{3/4}", "no answer"], ["a", "b", "c"])
    assert grades == [Grade(1.0), Grade(0.0), Grade(0.0)]


def test_rule_grader_out_of_range_names_the_response(monkeypatch):
    from ac2_core.tasks import arith

    monkeypatch.setattr(arith, "grade", lambda answer, response: 1.5)
    row = {"problem_id": "p1", "task": "arith", "answer": "3", "prompt": "1+2\n"}
    with pytest.raises(ValueError, match=r"grader 'arith' returned 1.5 for chunk c7 \(problem p1\); rewards must be finite"):
        grade_many(TaskConfig(), [row], ["#3"], ["chunk c7"])


def test_proof_rows_are_not_rule_graded():
    with pytest.raises(ValueError, match="rubric judge"):
        grade("proof", None, "a proof")


def test_judge_item_reads_metadata_and_skips_the_reasoning():
    row = {
        "problem_id": "p1",
        "prompt": "Prove it.",
        "solution": "Ref.",
        "metadata": json.dumps({"rubrics": ["r1"], "guidelines": None}),
    }
    item = judge_item(row, "<think>scratch 7/7</think>\nThe proof.")
    assert (item.problem, item.proof, item.rubrics, item.reference_solution) == ("Prove it.", "\nThe proof.", ("r1",), "Ref.")
    assert answer_part("no reasoning block") == "no reasoning block"


@pytest.mark.parametrize("metadata", [None, "{}", json.dumps({"rubrics": []}), "not json"])
def test_judge_item_refuses_a_problem_without_rubrics(metadata):
    row = {"problem_id": "p9", "prompt": "Prove it.", "solution": None, "metadata": metadata}
    with pytest.raises(ValueError, match="problem p9"):
        judge_item(row, "proof")
