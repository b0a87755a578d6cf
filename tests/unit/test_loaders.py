"""Problem files -> PROBLEMS (ac2_core.tasks.loaders), from fixture files written here."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ac2_core.schemas import PROBLEMS
from ac2_core.tasks.loaders import DataError, load_problems

FINEPROOFS = [
    {
        "problem": f"Prove that {i} + {i} is even.",
        "source": "olympiad",
        "rubrics": ["States 2k form (2 pts)", "Concludes (5 pts)"],
        "scores": [7, 0],
        "rewards": [1.0, 0.0],
        "num_rewards": 2,
        "reward_mean": i / 10,
        "reward_std": 0.5,
    }
    for i in range(10)
]
PROOFBENCH = [
    {
        "Problem ID": f"PB-{i}",
        "Problem": f"Show that there are infinitely many primes of form {i}k+1.",
        "Solution": "Consider cyclotomic polynomials ...",
        "Grading guidelines": "7: complete. 1: a correct lemma.",
        "Source": "IMO shortlist",
        "Level": "hard",
    }
    for i in range(6)
]
FINAL = [{"problem": f"What is {i} * 3?", "answer": 3 * i, "solution": f"{i}*3={3 * i}"} for i in range(8)]


def _parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _hf(path, rows):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return str(path)


WRITERS = {"parquet": (_parquet, "p.parquet"), "jsonl": (_jsonl, "p.jsonl"), "hf": (_hf, "hfdir")}


def _write(tmp_path, kind, rows):
    writer, name = WRITERS[kind]
    return writer(tmp_path / name, rows)


# FineProofs-RL rubrics come as lists or as one string; Parquet and datasets hold one type per column
FINEPROOFS_STR = [dict(r, rubrics="Full proof: 7 pts") for r in FINEPROOFS]


@pytest.mark.parametrize("kind", list(WRITERS))
@pytest.mark.parametrize("as_string", [False, True])
def test_fineproofs_each_format(tmp_path, kind, as_string):
    uri = _write(tmp_path, kind, FINEPROOFS_STR if as_string else FINEPROOFS)
    got = load_problems(uri, task="fineproofs", shape="fineproofs", val_fraction=0.3, seed=1)
    assert got.table.schema == PROBLEMS
    assert got.table.num_rows == 10 and got.rows_read == 10
    rows = got.table.to_pylist()
    assert {r["task"] for r in rows} == {"fineproofs"}
    assert [r["split"] for r in rows] == sorted((r["split"] for r in rows), key=lambda s: s != "val")
    by_prompt = {r["prompt"]: got.metadata[r["problem_id"]] for r in rows}
    # a string rubric becomes a one-item list; a list stays a list
    expected = ["Full proof: 7 pts"] if as_string else ["States 2k form (2 pts)", "Concludes (5 pts)"]
    assert by_prompt["Prove that 1 + 1 is even."]["rubrics"] == expected
    assert by_prompt["Prove that 3 + 3 is even."]["reward_mean"] == pytest.approx(0.3)
    assert by_prompt["Prove that 3 + 3 is even."]["num_rewards"] == 2


@pytest.mark.parametrize("kind", list(WRITERS))
def test_proofbench_each_format(tmp_path, kind):
    uri = _write(tmp_path, kind, PROOFBENCH)
    got = load_problems(uri, task="fineproofs", shape="proofbench", val_fraction=0.0)
    rows = got.table.to_pylist()
    assert [r["problem_id"] for r in rows] == [f"PB-{i}" for i in range(6)]  # file order, ids from the file
    assert all(r["solution"].startswith("Consider cyclotomic") and r["split"] == "train" for r in rows)
    meta = got.metadata["PB-2"]
    assert meta["guidelines"] == "7: complete. 1: a correct lemma." and meta["Level"] == "hard" and meta["rubrics"] == []


@pytest.mark.parametrize("kind", list(WRITERS))
def test_final_answer_each_format(tmp_path, kind):
    uri = _write(tmp_path, kind, FINAL)
    got = load_problems(uri, task="math", shape="final_answer", val_fraction=0.25, seed=3)
    rows = {r["prompt"]: r for r in got.table.to_pylist()}
    assert rows["What is 4 * 3?"]["answer"] == "12"  # numbers become text
    assert rows["What is 4 * 3?"]["solution"] == "4*3=12"


def test_column_mapping(tmp_path):
    rows = [{"question": "What is 1+1?", "final": "2"}, {"question": "What is 2+2?", "final": "4"}]
    uri = _jsonl(tmp_path / "q.jsonl", rows)
    got = load_problems(uri, task="math", shape="final_answer", columns={"problem": "question", "answer": "final"})
    assert sorted(got.table.column("answer").to_pylist()) == ["2", "4"]


def test_split_is_stable_under_reordering_and_seeded(tmp_path):
    many = [{"problem": f"Problem number {i}", "answer": "1"} for i in range(400)]
    a = load_problems(_jsonl(tmp_path / "a.jsonl", many), task="math", shape="final_answer", val_fraction=0.2, seed=7)
    b = load_problems(_jsonl(tmp_path / "b.jsonl", many[::-1]), task="math", shape="final_answer", val_fraction=0.2, seed=7)
    c = load_problems(_jsonl(tmp_path / "c.jsonl", many), task="math", shape="final_answer", val_fraction=0.2, seed=8)
    split = lambda t: {r["prompt"]: r["split"] for r in t.table.to_pylist()}  # noqa: E731
    assert split(a) == split(b)
    assert split(a) != split(c)
    assert 40 <= a.counts["val"] <= 120  # 20% of 400 = 80, give or take the hash's chance


def test_duplicates_kept_once(tmp_path):
    rows = [
        {"problem": "Same  text", "answer": "1"},
        {"problem": "Same text ", "answer": "2"},
        {"problem": "Other", "answer": "3"},
    ]
    got = load_problems(_jsonl(tmp_path / "d.jsonl", rows), task="math", shape="final_answer")
    assert got.table.num_rows == 2 and got.duplicates_dropped == 1
    assert "1" in got.table.column("answer").to_pylist()  # the first occurrence


def test_reward_mean_filter(tmp_path):
    uri = _parquet(tmp_path / "f.parquet", FINEPROOFS)
    got = load_problems(uri, task="fineproofs", shape="fineproofs", min_reward_mean=0.2, max_reward_mean=0.5)
    kept = sorted(m["reward_mean"] for m in got.metadata.values())
    assert kept == pytest.approx([0.2, 0.3, 0.4, 0.5]) and got.filtered_out == 6


# ---------------------------------------------------------------------- bad input


def _error(tmp_path, rows, *, shape="fineproofs", **kw) -> str:
    uri = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError) as e:
        load_problems(uri, task="t", shape=shape, **kw)
    msg = str(e.value)
    assert "bad.jsonl" in msg
    return msg


def test_missing_problem_text(tmp_path):
    rows = [dict(FINEPROOFS[0]), dict(FINEPROOFS[1], problem=None)]
    msg = _error(tmp_path, rows)
    assert "row 1" in msg and "'problem'" in msg and "null" in msg


def test_blank_problem_text(tmp_path):
    msg = _error(tmp_path, [dict(FINEPROOFS[0]), dict(FINEPROOFS[1]), dict(FINEPROOFS[2], problem="   ")])
    assert "row 2" in msg and "'problem'" in msg and "empty" in msg


@pytest.mark.parametrize("rubric", [7, {"a": 1}, ["ok", 3]])
def test_rubric_of_wrong_type(tmp_path, rubric):
    msg = _error(tmp_path, [dict(FINEPROOFS[0]), dict(FINEPROOFS[1], rubrics=rubric)])
    assert "row 1" in msg and "'rubrics'" in msg and "a string or a list of strings" in msg


def test_rubric_of_wrong_type_in_parquet(tmp_path):
    rows = [dict(r, rubrics=7) for r in FINEPROOFS[:2]]  # parquet holds one type per column, so every row
    uri = _parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(DataError, match=r"bad\.parquet: row 0: column 'rubrics'.*found int"):
        load_problems(uri, task="t", shape="fineproofs")


def test_missing_mapped_column(tmp_path):
    msg = _error(tmp_path, FINAL, shape="final_answer", columns={"answer": "final_answer"})
    assert "'final_answer'" in msg and "task.columns.answer" in msg and "not found" in msg


def test_missing_required_default_column(tmp_path):
    msg = _error(tmp_path, [{"problem": "x"}])
    assert "'rubrics'" in msg and "not found" in msg


def test_empty_file(tmp_path):
    msg = _error(tmp_path, [])
    assert "no rows" in msg


def test_empty_after_filtering(tmp_path):
    msg = _error(tmp_path, FINEPROOFS, min_reward_mean=0.95)
    assert "no problems left" in msg and "task.min_reward_mean" in msg


def test_bad_reward_mean(tmp_path):
    msg = _error(tmp_path, [dict(FINEPROOFS[0]), dict(FINEPROOFS[1], reward_mean="high")], max_reward_mean=0.9)
    assert "row 1" in msg and "'reward_mean'" in msg


def test_not_json(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(FINAL[0]) + "\n{not json\n")
    with pytest.raises(DataError, match=r"bad\.jsonl: line 2 \(row 1\): not JSON"):
        load_problems(str(path), task="math", shape="final_answer")


def test_repeated_problem_id(tmp_path):
    rows = [dict(PROOFBENCH[0]), dict(PROOFBENCH[1], **{"Problem ID": "PB-0"})]
    msg = _error(tmp_path, rows, shape="proofbench")
    assert "row 1" in msg and "'Problem ID'" in msg and "repeats row 0" in msg


def test_unknown_format(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("problem\nx\n")
    with pytest.raises(DataError, match="task.format"):
        load_problems(str(path), task="math", shape="final_answer")
