"""Bad data files: every decode or parse error names the file, the row and the column, and a run
that meets one writes nothing under ``--out``, whichever runner."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ac2_core.tasks.loaders import DataError, load_problems
from pipelines import exits
from pipelines.cli import main
from tests.conftest import tiny_config
from tests.faults.conftest import config_yaml

ROWS = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i), "solution": f"{i} + {i} = {2 * i}"} for i in range(16)]


def _jsonl_bytes(rows) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _load(path) -> None:
    load_problems(str(path), task="math", shape="final_answer", val_fraction=0.25)


def test_a_byte_that_is_not_utf8_names_the_file_line_row_and_column(tmp_path):
    data = _jsonl_bytes(ROWS).replace(b"What is 5 + 5?", b"What is 5 \xff 5?")
    (path := tmp_path / "math.jsonl").write_bytes(data)
    with pytest.raises(DataError) as err:
        _load(path)
    assert str(err.value) == f"{path}: line 6 (row 5): column 'problem': byte 0xff at offset 23 of the line is not UTF-8"


def test_a_bad_byte_outside_any_string_names_the_line_and_row(tmp_path):
    (path := tmp_path / "math.jsonl").write_bytes(_jsonl_bytes(ROWS[:3]) + b'{"problem": "x", \xfe"answer": "1"}\n')
    with pytest.raises(DataError, match=rf"^{path}: line 4 \(row 3\): byte 0xfe at offset 17 of the line is not UTF-8$"):
        _load(path)


def test_text_that_is_not_utf8_in_a_parquet_file_names_the_row_and_column(tmp_path):
    problems = pa.array([r["problem"].encode() for r in ROWS[:4]] + [b"caf\xe9?"], pa.binary()).view(pa.string())
    table = pa.table({"problem": problems, "answer": pa.array([r["answer"] for r in ROWS[:5]])})
    pq.write_table(table, path := tmp_path / "math.parquet")
    with pytest.raises(DataError, match=rf"^{path}: row 4: column 'problem': text that is not UTF-8"):
        _load(path)


def test_a_truncated_compressed_file_names_the_line_it_stopped_at(tmp_path):
    import gzip

    whole = gzip.compress(_jsonl_bytes(ROWS))
    (path := tmp_path / "math.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match=rf"^{path}: cannot read past line \d+"):
        _load(path)


def test_json_nested_too_deeply_names_the_line(tmp_path):
    (path := tmp_path / "math.jsonl").write_bytes(_jsonl_bytes(ROWS[:2]) + b"[" * 100_000 + b"\n")
    with pytest.raises(DataError, match=rf"^{path}: line 3 \(row 2\): not JSON \(nested too deeply\)$"):
        _load(path)


# Damage anywhere in a data file: whatever the bytes, either the problems load or one DataError names the file.
_DAMAGE = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10_000), st.just(0)),
)


def _damaged(data: bytes, damage) -> bytes:
    kind, at, arg = damage
    at %= len(data)
    match kind:
        case "insert":
            return data[:at] + arg + data[at:]
        case "flip":
            return data[:at] + bytes([data[at] ^ arg]) + data[at + 1 :]
        case _:
            return data[:at]


def _parquet_bytes(rows) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()


@settings(max_examples=120)
@given(fmt=st.sampled_from(["jsonl", "parquet"]), damage=_DAMAGE)
def test_a_damaged_data_file_loads_or_is_refused_naming_the_file(tmp_path, fmt, damage):
    whole = _jsonl_bytes(ROWS) if fmt == "jsonl" else _parquet_bytes(ROWS)
    path = tmp_path / f"math.{fmt}"
    path.write_bytes(_damaged(whole, damage))
    try:
        _load(path)
    except DataError as e:
        assert str(e).startswith(f"{path}: "), e
        if fmt == "jsonl" and "line " in str(e):
            assert "(row " in str(e) or "cannot read past" in str(e), e


# ------------------------------------------------------------ nothing under --out


@pytest.mark.parametrize("runner", ["kfp", "inprocess"])
def test_a_run_with_a_bad_row_writes_nothing_under_out(tmp_path, capsys, runner):
    bad = [*ROWS[:7], {"problem": None, "answer": "3"}, *ROWS[7:]]
    (path := tmp_path / "math.jsonl").write_bytes(_jsonl_bytes(bad))
    cfg = tiny_config(task__name="math", task__data=str(path), task__shape="final_answer", task__val_fraction=0.25)
    out = tmp_path / "out"
    assert main(["run", "--config", config_yaml(cfg, tmp_path), "--out", str(out), "--runner", runner]) == exits.FAILED
    assert capsys.readouterr().err == f"ac2: {path}: row 7: column 'problem': missing problem (expected text, found null)\n"
    assert not out.exists()


def test_a_run_whose_data_file_is_missing_writes_nothing_in_an_existing_out(tmp_path, capsys):
    cfg = tiny_config(task__name="math", task__data=str(tmp_path / "gone.jsonl"), task__shape="final_answer")
    (out := tmp_path / "out").mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["run", "--config", config_yaml(cfg, tmp_path), "--out", str(out)]) == exits.FAILED
    assert "gone.jsonl: no such file or directory" in capsys.readouterr().err
    assert sorted(p.name for p in Path(out).iterdir()) == ["notes.txt"]
