"""Artifacts on the local file system: published whole, verified on read, refused with a message.

Every case goes through the real ``ac2_core.storage`` functions on ``tmp_path``.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import save_file

from ac2_core.schemas import SCHEMA_VERSION, schema_for
from ac2_core.storage import (
    ArtifactError,
    Manifest,
    content_hash,
    exists,
    local_model_dir,
    publish_dir,
    read_manifest,
    read_rows,
    read_table,
    table_from_rows,
    tables,
    write_table,
)
from ac2_core.storage.artifacts import verified_bytes

CFG_HASH = "cfg-0"


def _pairs(n: int = 3, *, prediction: float = 0.25) -> list[dict]:
    return [
        {
            "run_id": "toy",
            "iteration": 2,
            "policy_version": 1,
            "pair_id": f"pair-{i}",
            "problem_id": f"p{i % 2}",
            "trajectory_id": f"t{i}",
            "cut": 16 * i,
            "ref_trajectory_id": None if i == 0 else f"ref{i}",
            "prediction": prediction + i / 8,
            "outcome": float(i % 2),
            "critic_tokens": 40 + i,
        }
        for i in range(n)
    ]


def _write_pairs(uri: str, rows: list[dict] | None = None):
    table = table_from_rows(_pairs() if rows is None else rows, "critic_pairs")
    return write_table(uri, table, kind="critic_pairs", stage="score_chunks", config_hash=CFG_HASH)


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def resealed(manifest: dict, name: str, data: bytes) -> str:
    """``manifest`` (parsed JSON) agreeing with ``data`` as file ``name``, content hash included, as JSON:
    what a foreign writer that forges a consistent manifest would write."""
    manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    manifest["content_hash"] = Manifest("", "", "", 1, None, manifest["files"]).content_hash
    return json.dumps(manifest)


def _rewrite_manifest_hash(uri: Path, name: str) -> None:
    """Make the manifest agree with the file ``name`` as it now is on disk."""
    manifest = json.loads((uri / "manifest.json").read_text())
    (uri / "manifest.json").write_text(resealed(manifest, name, (uri / name).read_bytes()))


# ------------------------------------------------------------------ round trips


def test_table_round_trip_keeps_rows_and_manifest(tmp_path):
    uri = str(tmp_path / "it-2" / "critic_pairs")
    rows = _pairs()
    manifest = _write_pairs(uri, rows)

    assert exists(uri)
    assert read_rows(uri, kind="critic_pairs") == rows
    table = read_table(uri, kind="critic_pairs")
    assert table.schema == schema_for("critic_pairs")
    assert manifest == read_manifest(uri)
    assert (manifest.kind, manifest.stage, manifest.config_hash) == ("critic_pairs", "score_chunks", CFG_HASH)
    assert manifest.schema_version == SCHEMA_VERSION
    assert manifest.rows == len(rows)
    assert sorted(manifest.files) == ["data.parquet"]
    data = (tmp_path / "it-2" / "critic_pairs" / "data.parquet").read_bytes()
    assert manifest.files["data.parquet"] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert sorted(p.name for p in Path(uri).iterdir()) == ["data.parquet", "manifest.json"]


def test_arrow_reads_a_table_from_memory_of_its_own(tmp_path, monkeypatch):
    """Arrow's reading threads may drop the last view of the file's bytes after ``read`` has returned.
    Over Python memory that takes the GIL, and a thread that asks for it while the interpreter
    finalizes aborts the process (rc 134 at the end of kfp.local's evaluate task). So no Arrow
    object views the bytes fetched from storage: a bytearray that something views cannot grow."""
    uri = str(tmp_path / "critic_pairs")
    _write_pairs(uri)
    fetched, viewed = [], []

    def fetch(*args):
        fetched.append(bytearray(verified_bytes(*args)))
        return fetched[-1]

    class ViewCheckingParquetFile(pq.ParquetFile):
        def read(self, *args, **kwargs):
            table = super().read(*args, **kwargs)
            try:  # with this reader still alive
                fetched[-1].append(0)
            except BufferError:
                viewed.append(True)
            else:
                viewed.append(False)
                del fetched[-1][-1]
            return table

    monkeypatch.setattr(tables, "verified_bytes", fetch)
    monkeypatch.setattr(pq, "ParquetFile", ViewCheckingParquetFile)
    assert read_rows(uri, kind="critic_pairs") == _pairs()
    assert viewed == [False], "Arrow read the table through a view of the Python bytes"


def test_empty_metrics_table_round_trips(tmp_path):
    uri = str(tmp_path / "metrics")
    write_table(uri, table_from_rows([], "metrics"), kind="metrics", stage="evaluate", config_hash=CFG_HASH)
    assert read_manifest(uri).rows == 0
    assert read_table(uri, kind="metrics").num_rows == 0


def test_same_table_twice_gives_identical_bytes_and_hash(tmp_path):
    a, b = tmp_path / "a" / "critic_pairs", tmp_path / "b" / "critic_pairs"
    _write_pairs(str(a))
    _write_pairs(str(b))
    assert content_hash(str(a)) == content_hash(str(b))
    for name in ("data.parquet", "manifest.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    # ... and the hash is about the content: other rows give another hash.
    c = tmp_path / "c" / "critic_pairs"
    _write_pairs(str(c), _pairs(prediction=0.5))
    assert content_hash(str(c)) != content_hash(str(a))


def test_rewriting_a_uri_replaces_it_and_leaves_nothing_beside_it(tmp_path):
    uri = tmp_path / "runs" / "critic_pairs"
    _write_pairs(str(uri), _pairs(3))
    _write_pairs(str(uri), _pairs(5, prediction=0.5))

    assert read_rows(str(uri), kind="critic_pairs") == _pairs(5, prediction=0.5)
    assert read_manifest(str(uri)).rows == 5
    assert _siblings(uri) == ["critic_pairs"]  # no staging or old folder left
    assert sorted(p.name for p in uri.iterdir()) == ["data.parquet", "manifest.json"]


def test_exception_inside_publish_dir_keeps_the_previous_artifact(tmp_path):
    uri = tmp_path / "runs" / "critic_pairs"
    _write_pairs(str(uri))
    before = content_hash(str(uri))

    with pytest.raises(RuntimeError, match="stage crashed"):
        with publish_dir(str(uri), kind="critic_pairs", stage="score_chunks", config_hash=CFG_HASH, rows=1) as staging:
            (staging / "data.parquet").write_bytes(b"half a file")
            raise RuntimeError("stage crashed")

    assert content_hash(str(uri)) == before
    assert read_rows(str(uri), kind="critic_pairs") == _pairs()
    assert _siblings(uri) == ["critic_pairs"]


def test_exception_inside_publish_dir_on_a_new_uri_publishes_nothing(tmp_path):
    uri = tmp_path / "runs" / "fresh"
    with pytest.raises(RuntimeError):
        with publish_dir(str(uri), kind="critic_pairs", stage="score_chunks", config_hash=CFG_HASH):
            raise RuntimeError("stage crashed")
    assert not exists(str(uri))
    assert _siblings(uri) == []


def test_writer_may_not_write_its_own_manifest(tmp_path):
    uri = tmp_path / "runs" / "model"
    with pytest.raises(ArtifactError, match=f"{uri}.*manifest.json"):
        with publish_dir(str(uri), kind="actor", stage="update_actor", config_hash=CFG_HASH) as staging:
            (staging / "manifest.json").write_text("{}")
    assert _siblings(uri) == []


def test_file_uri_is_the_same_as_a_plain_path(tmp_path):
    plain = tmp_path / "plain" / "critic_pairs"
    _write_pairs(str(plain))
    as_uri = (tmp_path / "uri" / "critic_pairs").as_uri()
    assert as_uri.startswith("file://")
    _write_pairs(as_uri)

    assert exists(as_uri)
    assert read_rows(as_uri, kind="critic_pairs") == _pairs()
    # Written through file://, read back through the plain path, and vice versa.
    assert read_rows(str(tmp_path / "uri" / "critic_pairs"), kind="critic_pairs") == _pairs()
    assert read_rows(plain.as_uri(), kind="critic_pairs") == _pairs()
    assert content_hash(as_uri) == content_hash(str(plain))
    assert _siblings(tmp_path / "uri" / "critic_pairs") == ["critic_pairs"]


# ---------------------------------------------------------------- refused reads


def test_data_that_does_not_match_its_manifest_is_refused(tmp_path):
    uri = tmp_path / "critic_pairs"
    _write_pairs(str(uri))
    data = bytearray((uri / "data.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (uri / "data.parquet").write_bytes(bytes(data))

    with pytest.raises(ArtifactError) as err:
        read_table(str(uri), kind="critic_pairs")
    assert str(uri) in str(err.value)
    assert "data.parquet does not match its manifest" in str(err.value)


def test_truncated_parquet_is_refused_as_unreadable(tmp_path):
    uri = tmp_path / "critic_pairs"
    _write_pairs(str(uri))
    data = (uri / "data.parquet").read_bytes()
    (uri / "data.parquet").write_bytes(data[: len(data) // 2])
    _rewrite_manifest_hash(uri, "data.parquet")  # so the hash check passes and Parquet is reached

    with pytest.raises(ArtifactError) as err:
        read_table(str(uri), kind="critic_pairs")
    assert str(uri) in str(err.value)
    assert "not a readable Parquet file" in str(err.value)


def test_row_count_that_disagrees_with_the_manifest_is_refused(tmp_path):
    uri = tmp_path / "critic_pairs"
    _write_pairs(str(uri))
    manifest = json.loads((uri / "manifest.json").read_text())
    manifest["rows"] = 4
    (uri / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="3 rows, manifest says 4"):
        read_table(str(uri), kind="critic_pairs")


def test_other_schema_version_is_refused(tmp_path):
    uri = tmp_path / "critic_pairs"
    _write_pairs(str(uri))
    manifest = json.loads((uri / "manifest.json").read_text())
    manifest["schema_version"] = SCHEMA_VERSION + 1
    (uri / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=f"schema version {SCHEMA_VERSION + 1}"):
        read_table(str(uri), kind="critic_pairs")


def test_malformed_manifest_is_refused(tmp_path):
    uri = tmp_path / "critic_pairs"
    _write_pairs(str(uri))
    (uri / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="manifest.json is malformed"):
        read_table(str(uri), kind="critic_pairs")


def test_reading_an_artifact_as_another_kind_is_refused(tmp_path):
    uri = str(tmp_path / "prefixes")
    rows = [
        {
            "run_id": "toy",
            "iteration": 0,
            "policy_version": 0,
            "prefix_id": "x",
            "problem_id": "p0",
            "mode": "full",
            "source_trajectory_id": None,
            "prefix_token_ids": [],
            "budget": 80,
            "ref_trajectory_id": None,
            "cut_scan_tokens": None,
            "baseline_rate": None,
        }
    ]
    write_table(uri, table_from_rows(rows, "prefixes"), kind="prefixes", stage="sample_prefixes", config_hash=CFG_HASH)
    assert read_rows(uri, kind="prefixes") == rows
    with pytest.raises(ArtifactError, match="expected a chunks table, found a prefixes artifact"):
        read_table(uri, kind="chunks")


def test_folder_without_manifest_was_never_published_whole(tmp_path):
    uri = tmp_path / "critic_pairs"
    _write_pairs(str(uri))
    (uri / "manifest.json").unlink()
    assert not exists(str(uri))
    with pytest.raises(ArtifactError, match="never published whole") as err:
        read_table(str(uri), kind="critic_pairs")
    assert str(uri) in str(err.value)


def test_missing_uri_says_there_is_no_artifact(tmp_path):
    with pytest.raises(ArtifactError, match="no artifact at this URI"):
        read_table(str(tmp_path / "nothing"), kind="critic_pairs")


# --------------------------------------------------------------- refused writes


def test_missing_column_is_named_and_nothing_is_written(tmp_path):
    uri = tmp_path / "out" / "critic_pairs"
    table = table_from_rows(_pairs(), "critic_pairs").drop_columns(["outcome"])
    with pytest.raises(ArtifactError) as err:
        write_table(str(uri), table, kind="critic_pairs", stage="score_chunks", config_hash=CFG_HASH)
    assert "missing column(s) outcome" in str(err.value)
    assert str(uri) in str(err.value)
    assert not uri.exists()
    assert not uri.parent.exists() or list(uri.parent.iterdir()) == []


def test_unexpected_column_is_named(tmp_path):
    table = table_from_rows(_pairs(), "critic_pairs").append_column("extra_col", pa.array([1, 2, 3]))
    with pytest.raises(ArtifactError, match="unexpected column.*extra_col"):
        write_table(str(tmp_path / "t"), table, kind="critic_pairs", stage="s", config_hash=CFG_HASH)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    "array, found",
    [(pa.array([2, 2, 2], pa.int64()), "int64"), (pa.array(["2", "2", "2"]), "string")],
)
def test_wrong_column_type_names_column_expected_and_found(tmp_path, array, found):
    table = table_from_rows(_pairs(), "critic_pairs")
    table = table.set_column(table.schema.get_field_index("iteration"), "iteration", array)
    uri = tmp_path / "critic_pairs"
    with pytest.raises(ArtifactError) as err:
        write_table(str(uri), table, kind="critic_pairs", stage="s", config_hash=CFG_HASH)
    assert f"column iteration of critic_pairs should be int32, found {found}" in str(err.value)
    assert not uri.exists()


def test_null_in_non_nullable_column_is_refused(tmp_path):
    rows = _pairs()
    rows[1]["trajectory_id"] = None
    table = table_from_rows(rows, "critic_pairs")  # Arrow itself does not enforce nullability
    with pytest.raises(ArtifactError, match="column trajectory_id of critic_pairs has 1 null value"):
        write_table(str(tmp_path / "t"), table, kind="critic_pairs", stage="s", config_hash=CFG_HASH)
    assert not (tmp_path / "t").exists()
    # A nullable column may hold nulls: row 0 of _pairs() has no ref_trajectory_id.
    _write_pairs(str(tmp_path / "ok"))


def test_nan_in_float_column_is_refused(tmp_path):
    rows = _pairs()
    rows[2]["prediction"] = math.nan
    with pytest.raises(ArtifactError, match="column prediction of critic_pairs contains NaN"):
        _write_pairs(str(tmp_path / "t"), rows)
    assert not (tmp_path / "t").exists()


def test_table_from_rows_with_an_unconvertible_value_names_the_table():
    rows = _pairs()
    rows[0]["cut"] = "sixteen"
    with pytest.raises(ArtifactError, match="cannot build critic_pairs table"):
        table_from_rows(rows, "critic_pairs")


# ------------------------------------------------------------------ model dirs


def _publish_model(uri: Path, files: dict[str, bytes | None], *, kind: str = "actor") -> None:
    """Publish a model folder; a None value writes a real (tiny) safetensors file."""
    with publish_dir(str(uri), kind=kind, stage="update_actor", config_hash=CFG_HASH) as staging:
        for name, content in files.items():
            if content is None:
                save_file({"w": torch.arange(4, dtype=torch.float32)}, str(staging / name))
            else:
                (staging / name).write_bytes(content)


def test_local_model_dir_accepts_a_safetensors_model(tmp_path):
    uri = tmp_path / "actor"
    _publish_model(uri, {"model.safetensors": None, "config.json": b"{}"})
    assert local_model_dir(str(uri), kind="actor") == uri
    assert local_model_dir(uri.as_uri(), kind="actor") == uri
    with pytest.raises(ArtifactError, match="expected a critic model, found a actor artifact"):
        local_model_dir(str(uri), kind="critic")


def test_local_model_dir_refuses_a_published_pickle(tmp_path):
    uri = tmp_path / "actor"
    _publish_model(uri, {"model.safetensors": None, "pytorch_model.bin": b"\x80\x02pickle"})
    with pytest.raises(ArtifactError, match="pickle-format file.*pytorch_model.bin") as err:
        local_model_dir(str(uri), kind="actor")
    assert str(uri) in str(err.value)


def test_local_model_dir_refuses_a_pickle_added_after_publishing(tmp_path):
    uri = tmp_path / "actor"
    _publish_model(uri, {"model.safetensors": None})
    (uri / "pytorch_model.bin").write_bytes(b"\x80\x02pickle")  # not in the manifest
    with pytest.raises(ArtifactError, match="pytorch_model.bin"):
        local_model_dir(str(uri), kind="actor")


def test_local_model_dir_refuses_a_folder_without_safetensors(tmp_path):
    uri = tmp_path / "actor"
    _publish_model(uri, {"config.json": b"{}"})
    with pytest.raises(ArtifactError, match=r"no \.safetensors weights") as err:
        local_model_dir(str(uri), kind="actor")
    assert str(uri) in str(err.value)


def test_local_model_dir_refuses_changed_weights(tmp_path):
    uri = tmp_path / "actor"
    _publish_model(uri, {"model.safetensors": None})
    save_file({"w": torch.zeros(4)}, str(uri / "model.safetensors"))
    with pytest.raises(ArtifactError, match="model.safetensors does not match its manifest"):
        local_model_dir(str(uri), kind="actor")
