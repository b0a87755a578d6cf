"""Problem files -> a ``PROBLEMS`` table, plus the grading metadata a judge needs.

Three layouts (``task.shape``), with these default columns (``task.columns`` renames any):

==============  ===============================================================
fineproofs      FineProofs-RL: ``problem``, ``rubrics`` (a string or a list of
                checkpoints), ``source``, ``reward_mean`` (also kept if present:
                ``scores``, ``rewards``, ``num_rewards``, ``reward_std``)
proofbench      IMO-ProofBench: ``Problem``, ``Solution``, ``Grading guidelines``,
                ``Problem ID``, ``Source`` (also kept: ``Short Answer``,
                ``Category``, ``Level``)
final_answer    ``problem``, ``answer``, ``solution`` (optional)
==============  ===============================================================

Formats: Parquet, JSONL, or a directory written by ``datasets.Dataset.save_to_disk``.

The validation split is chosen by a seeded hash of the whitespace-normalised problem
text, so a problem keeps its split when rows are added, removed or reordered, and a
problem that occurs twice cannot sit on both sides. Rows with the same text are kept
once (the first). A bad row stops the load with the file, row index (0-based, in file
order) and column in the message.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from ac2_core.schemas import PROBLEMS

Shape = Literal["fineproofs", "proofbench", "final_answer"]
Format = Literal["auto", "parquet", "jsonl", "hf_dataset"]

# Per shape: field -> default column. Required fields must be present and non-null.
_DEFAULT_COLUMNS: dict[str, dict[str, str]] = {
    "fineproofs": {"problem": "problem", "rubrics": "rubrics", "source": "source", "reward_mean": "reward_mean"},
    "proofbench": {
        "problem_id": "Problem ID",
        "problem": "Problem",
        "solution": "Solution",
        "guidelines": "Grading guidelines",
        "source": "Source",
    },
    "final_answer": {"problem": "problem", "answer": "answer", "solution": "solution"},
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    "fineproofs": ("problem", "rubrics"),
    "proofbench": ("problem", "guidelines"),
    "final_answer": ("problem", "answer"),
}
# Extra columns copied into the metadata as they are, when the file has them.
_PASSTHROUGH: dict[str, tuple[str, ...]] = {
    "fineproofs": ("scores", "rewards", "num_rewards", "reward_std"),
    "proofbench": ("Short Answer", "Category", "Level"),
    "final_answer": (),
}
FIELDS = ("problem_id", "problem", "answer", "solution", "rubrics", "guidelines", "source", "reward_mean")


class DataError(ValueError):
    """A problem file that cannot be used; the message names the file, row and column."""


@dataclass(frozen=True)
class LoadedProblems:
    """``table``: PROBLEMS rows (val first, then train). ``metadata``: problem_id -> grading material.

    ``metadata[pid]`` holds ``rubrics`` (list of str, possibly empty), ``guidelines``,
    ``source``, ``reward_mean`` and the shape's pass-through columns. The reference
    solution is in the table's ``solution`` column.
    """

    table: pa.Table
    metadata: dict[str, dict[str, Any]]
    rows_read: int
    duplicates_dropped: int
    filtered_out: int
    counts: dict[str, int] = field(default_factory=dict)  # split -> problems


def load_problems(
    uri: str,
    *,
    task: str,
    shape: Shape,
    fmt: Format = "auto",
    columns: Mapping[str, str | None] | None = None,
    val_fraction: float = 0.05,
    seed: int = 0,
    min_reward_mean: float | None = None,
    max_reward_mean: float | None = None,
) -> LoadedProblems:
    """Read ``uri`` and return its problems in the PROBLEMS schema, ``task`` in the task column.

    ``columns`` maps a field (``FIELDS``) to a column of the file; a None value keeps
    the shape's default. Raises DataError on a missing mapped column, a bad row, or no
    problems left after the reward filter.
    """
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction: expected a number in [0, 1), found {val_fraction}")
    mapping = _mapping(shape, columns or {})
    rows = read_rows(uri, fmt=fmt)
    if not rows:
        raise DataError(f"{uri}: no rows")
    filtering = min_reward_mean is not None or max_reward_mean is not None
    _check_columns(uri, rows, shape, mapping, columns, filtering)

    seen: set[str] = set()
    ids: dict[str, int] = {}
    out: list[dict] = []
    metadata: dict[str, dict[str, Any]] = {}
    duplicates = filtered = 0
    for index, row in enumerate(rows):
        parsed = _parse_row(row, uri=uri, index=index, shape=shape, mapping=mapping, require_reward=filtering)
        text_key = normal_text(parsed["problem"])
        if text_key in seen:
            duplicates += 1
            continue
        seen.add(text_key)
        rm = parsed["reward_mean"]
        if (min_reward_mean is not None and rm < min_reward_mean) or (max_reward_mean is not None and rm > max_reward_mean):
            filtered += 1
            continue
        pid = parsed["problem_id"] or f"{task}-{hashlib.sha256(text_key.encode()).hexdigest()[:16]}"
        if pid in ids:
            raise DataError(
                f"{uri}: row {index}: column {mapping.get('problem_id')!r}: problem id {pid!r} repeats row {ids[pid]}"
            )
        ids[pid] = index
        out.append(
            {
                "problem_id": pid,
                "split": _split(text_key, seed=seed, val_fraction=val_fraction),
                "task": task,
                **{k: parsed[k] for k in ("answer", "solution")},
                "prompt": parsed["problem"],
            }
        )
        metadata[pid] = parsed["metadata"]
    if not out:
        raise DataError(
            f"{uri}: no problems left: {len(rows)} rows, {duplicates} duplicates, {filtered} outside "
            f"reward_mean in [{min_reward_mean}, {max_reward_mean}] (task.min_reward_mean / task.max_reward_mean)"
        )
    out.sort(key=lambda r: r["split"] != "val")  # stable: file order within a split
    counts = {s: sum(r["split"] == s for r in out) for s in ("train", "val")}
    table = pa.Table.from_pylist(out, schema=PROBLEMS)
    return LoadedProblems(table, metadata, len(rows), duplicates, filtered, counts)


def _split(text_key: str, *, seed: int, val_fraction: float) -> str:
    """val when a seeded hash of the normalised text falls below ``val_fraction``: a problem
    keeps its split when the file changes, and duplicates land on one side."""
    digest = hashlib.sha256(f"{seed}\0{text_key}".encode()).hexdigest()
    return "val" if int(digest[:15], 16) / 16**15 < val_fraction else "train"


def _check_columns(uri: str, rows: list[dict], shape: Shape, mapping: dict, columns, filtering: bool) -> None:
    """Every column the shape needs, the config names, or the reward filter reads is in the file."""
    needed = [f for f in _REQUIRED[shape] if f in mapping] + [f for f in mapping if f in _explicit(columns)]
    if filtering:
        if "reward_mean" not in mapping:
            raise DataError(f"{uri}: the reward_mean filter needs task.columns.reward_mean to name a column")
        needed.append("reward_mean")
    present = set().union(*(r.keys() for r in rows[:1000]))
    for f in dict.fromkeys(needed):
        if mapping[f] not in present:
            raise DataError(f"{uri}: column {mapping[f]!r} (task.columns.{f}) not found; columns are {sorted(present)}")


def _explicit(columns: Mapping[str, str | None] | None) -> set[str]:
    return {k for k, v in (columns or {}).items() if v is not None}


def _mapping(shape: str, columns: Mapping[str, str | None]) -> dict[str, str]:
    if shape not in _DEFAULT_COLUMNS:
        raise ValueError(f"task.shape: expected one of {sorted(_DEFAULT_COLUMNS)}, found {shape!r}")
    unknown = set(columns) - set(FIELDS)
    if unknown:
        raise ValueError(f"task.columns: unknown field(s) {sorted(unknown)}; known: {list(FIELDS)}")
    mapping = dict(_DEFAULT_COLUMNS[shape])
    mapping.update({k: v for k, v in columns.items() if v is not None})
    return mapping


def normal_text(text: str) -> str:
    """The problem text with whitespace runs made one space: what duplicates and splits are decided on."""
    return re.sub(r"\s+", " ", text).strip()


# ---------------------------------------------------------------------- one row


def _bad(uri: str, index: int, column: str, what: str) -> DataError:
    return DataError(f"{uri}: row {index}: column {column!r}: {what}")


def _text(row: dict, f: str, mapping: dict[str, str], *, uri: str, index: int, required: bool) -> str | None:
    if f not in mapping:
        return None
    column = mapping[f]
    value = row.get(column)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        if required:
            raise _bad(uri, index, column, f"missing {f} (expected text, found null)")
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and f in ("answer", "problem_id"):
        value = str(value)  # answers such as 42 are often stored as numbers
    if not isinstance(value, str):
        raise _bad(uri, index, column, f"expected {f} as text, found {type(value).__name__}")
    if required and not value.strip():
        raise _bad(uri, index, column, f"empty {f}")
    return value


def _rubrics(row: dict, mapping: dict[str, str], *, uri: str, index: int, required: bool) -> list[str]:
    if "rubrics" not in mapping:
        return []
    column = mapping["rubrics"]
    value = row.get(column)
    if value is None:
        if required:
            raise _bad(uri, index, column, "missing rubrics (expected a string or a list of strings, found null)")
        return []
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = list(value)
    else:
        found = type(value).__name__
        if isinstance(value, (list, tuple)):
            found = "list containing " + ", ".join(sorted({type(v).__name__ for v in value if not isinstance(v, str)}))
        raise _bad(uri, index, column, f"expected rubrics as a string or a list of strings, found {found}")
    items = [v for v in items if v.strip()]
    if required and not items:
        raise _bad(uri, index, column, "empty rubrics")
    return items


def _reward_mean(row: dict, mapping: dict[str, str], *, uri: str, index: int, required: bool) -> float | None:
    if "reward_mean" not in mapping:
        return None
    column = mapping["reward_mean"]
    value = row.get(column)
    if value is None:
        if required:
            raise _bad(uri, index, column, "missing reward_mean, needed by the reward_mean filter")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(uri, index, column, f"expected reward_mean as a finite number, found {value!r}")
    return float(value)


def _parse_row(row: dict, *, uri: str, index: int, shape: str, mapping: dict[str, str], require_reward: bool) -> dict:
    required = _REQUIRED[shape]
    t = lambda f: _text(row, f, mapping, uri=uri, index=index, required=f in required)  # noqa: E731
    parsed = {f: t(f) for f in ("problem_id", "problem", "answer", "solution", "guidelines", "source")}
    parsed["reward_mean"] = _reward_mean(row, mapping, uri=uri, index=index, required=require_reward)
    meta: dict[str, Any] = {
        "rubrics": _rubrics(row, mapping, uri=uri, index=index, required="rubrics" in required),
        "guidelines": parsed["guidelines"],
        "source": parsed["source"],
        "reward_mean": parsed["reward_mean"],
    }
    for column in _PASSTHROUGH[shape]:
        if row.get(column) is not None:
            meta[column] = row[column]
    parsed["metadata"] = meta
    return parsed


# ---------------------------------------------------------------------- formats


def detect_format(uri: str) -> Literal["parquet", "jsonl", "hf_dataset"]:
    fs, path = fsspec.core.url_to_fs(uri)
    if fs.isdir(path):
        if fs.exists(f"{path}/dataset_info.json") or fs.exists(f"{path}/dataset_dict.json"):
            return "hf_dataset"
        raise DataError(f"{uri}: a directory that is not a datasets.save_to_disk directory (no dataset_info.json)")
    name = path.lower()
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".jsonl", ".json", ".ndjson", ".jsonl.gz")):
        return "jsonl"
    raise DataError(f"{uri}: cannot tell the format from the name; set task.format to parquet, jsonl or hf_dataset")


def read_rows(uri: str, *, fmt: Format = "auto") -> list[dict]:
    """Every row of ``uri`` as a dict, in file order; DataError naming the file, row and column
    for any text that is not UTF-8 and any line that is not JSON."""
    fmt = detect_format(uri) if fmt == "auto" else fmt
    try:
        match fmt:
            case "parquet":
                with fsspec.open(uri, "rb") as f:
                    # one file, one thread: no dataset layer, and no Arrow thread pool alive at exit
                    return _pylist(uri, pq.ParquetFile(f).read(use_threads=False))
            case "jsonl":
                return _read_jsonl(uri)
            case "hf_dataset":
                return _read_hf(uri)
            case _:
                raise ValueError(f"task.format: unknown format {fmt!r}")
    except FileNotFoundError:
        raise DataError(f"{uri}: no such file or directory") from None
    except (pa.ArrowException, OSError, EOFError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{uri}: cannot read as {fmt}: {e}") from None


def _pylist(uri: str, table: pa.Table) -> list[dict]:
    """The table's rows, once every text column is known to be UTF-8 (else DataError naming the row and column)."""
    for name in table.column_names:
        column = table.column(name)
        try:
            column.validate(full=True)  # checks that every string is UTF-8
        except pa.ArrowInvalid as e:
            raise DataError(f"{uri}: row {_first_bad_text(column)}: column {name!r}: text that is not UTF-8 ({e})") from None
    return table.to_pylist()


def _as_bytes(typ: pa.DataType) -> pa.DataType | None:
    """``typ`` with its strings read as bytes (for finding the row that is not UTF-8), or None."""
    if pa.types.is_string(typ):
        return pa.binary()
    if pa.types.is_large_string(typ):
        return pa.large_binary()
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        inner = _as_bytes(typ.value_type)
        return None if inner is None else (pa.list_ if pa.types.is_list(typ) else pa.large_list)(inner)
    return None


def _first_bad_text(column: pa.ChunkedArray) -> int | str:
    """The 0-based row of the first value in ``column`` that is not UTF-8 ("?" where the type is not text or a list of it)."""
    as_bytes = _as_bytes(column.type)
    if as_bytes is None:
        return "?"
    for index, value in enumerate(column.cast(as_bytes).to_pylist()):
        for item in value if isinstance(value, list) else [value]:
            try:
                item is None or item.decode("utf-8")
            except UnicodeDecodeError:
                return index
    return "?"


def _read_jsonl(uri: str) -> list[dict]:
    """Read as bytes and decode line by line, so that a bad byte is reported with its line, row and column."""
    rows: list[dict] = []
    line_no = 0
    with fsspec.open(uri, "rb", compression="infer") as f:
        try:
            for line_no, raw in enumerate(f, start=1):
                row = _json_row(uri, raw, line_no, len(rows))
                if row is not None:
                    rows.append(row)
        except (OSError, EOFError) as e:  # a truncated or damaged compressed file
            raise DataError(f"{uri}: cannot read past line {line_no}: {e}") from None
    return rows


def _json_row(uri: str, raw: bytes, line_no: int, row: int) -> dict | None:
    where = f"{uri}: line {line_no} (row {row})"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        column = _column_holding_bad_bytes(raw)
        at = f": column {column!r}" if column else ""
        raise DataError(f"{where}{at}: byte 0x{raw[e.start]:02x} at offset {e.start} of the line is not UTF-8") from None
    if not line.strip():
        return None
    try:
        parsed = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: not JSON ({e.msg} at character {e.colno})") from None
    except RecursionError:
        raise DataError(f"{where}: not JSON (nested too deeply)") from None
    if not isinstance(parsed, dict):
        raise DataError(f"{where}: expected a JSON object, found {type(parsed).__name__}")
    return parsed


def _column_holding_bad_bytes(raw: bytes) -> str | None:
    """The key of the first field whose text holds bytes that are not UTF-8, if the line is JSON apart from them."""
    try:
        parsed = json.loads(raw.decode("utf-8", errors="surrogateescape"))  # bad bytes become lone surrogates
    except (ValueError, RecursionError):
        return None
    if not isinstance(parsed, dict):
        return None
    for key, value in parsed.items():
        text = key + json.dumps(value, ensure_ascii=False)
        if any("\udc80" <= ch <= "\udcff" for ch in text):
            return key.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")
    return None


def _read_hf(uri: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{uri}: reading a datasets directory needs the datasets package: pip install 'ac2[data]'") from None
    local = Path(uri)
    ds = datasets.load_from_disk(str(local) if local.exists() else uri)
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise DataError(f"{uri}: a DatasetDict without a 'train' split (splits: {sorted(ds)})")
        ds = ds["train"]
    return _pylist(uri, ds.with_format("arrow")[:])
