"""Damaged and hostile artifacts: each is refused with one ArtifactError that names its URI and
what is wrong, and the stage that meets it writes nothing.

The named cases are those users met (a manifest that is a JSON list, a file entry that is a
string or has no sha256, a truncated safetensors file, a config.json that is not JSON, with
the manifest rewritten to match). The generated ones (``hypothesis``) mutate manifests,
table bytes and model files in ways nobody listed: whatever comes out, a reader either
returns what a consistent manifest describes or raises ArtifactError naming the URI.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ac2_core import storage
from ac2_core.models.store import ModelStore
from ac2_core.storage import ArtifactError
from pipelines import exits
from pipelines.cli import main
from tests.faults.conftest import config_yaml
from tests.storage.test_local_artifacts import resealed


def _copy(src: Path, dst: Path) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def _check_readiness(cfg, run: Path, folder: Path, critic_pairs: Path) -> list[str]:
    """``ac2 stage check_readiness`` argv reading ``critic_pairs`` and writing under ``folder``/out."""
    return [
        "stage", "check_readiness", "--config", config_yaml(cfg, folder),
        "--in", f"readiness={run / 'bootstrap' / 'readiness'}",
        "--in", f"critic_pairs={critic_pairs}",
        "--in", f"scored_chunks={run / 'iter-0001' / 'score_chunks' / 'scored_chunks'}",
        "--out", f"readiness={folder / 'out' / 'readiness'}",
        "--out", f"advantages={folder / 'out' / 'advantages'}",
    ]  # fmt: skip


def _manifest(folder: Path) -> dict:
    return json.loads((folder / storage.MANIFEST).read_text())


# ------------------------------------------------------------------ named cases


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda m: [m], r"manifest.json is malformed \(the top level: Input should be a valid dictionary"),
        (lambda m: m | {"files": {"data.parquet": "abc"}}, r"malformed \(files.data.parquet: Input should be a valid dict"),
        (lambda m: m | {"files": {"data.parquet": {"bytes": 3}}}, r"malformed \(files.data.parquet.sha256: Field required"),
        (lambda m: m | {"rows": "12"}, r"malformed \(rows: Input should be a valid integer"),
        (lambda m: m | {"files": {"../../x": m["files"]["data.parquet"]}}, r"'../../x' is not a plain relative path"),
    ],
    ids=["list", "entry-is-a-string", "entry-without-sha256", "rows-as-text", "path-outside"],
)
def test_a_malformed_manifest_stops_ac2_stage_with_one_line_naming_the_artifact(finished_run, tmp_path, capsys, damage, expected):
    cfg, run = finished_run
    pairs = _copy(run / "iter-0001" / "score_chunks" / "critic_pairs", tmp_path / "critic_pairs")
    (pairs / storage.MANIFEST).write_text(json.dumps(damage(_manifest(pairs))))
    assert main(_check_readiness(cfg, run, tmp_path, pairs)) == exits.FAILED
    err = capsys.readouterr().err
    assert err.startswith(f"ac2: {pairs}: ") and err.count("\n") == 1, err
    assert re.search(expected, err), err
    assert not (tmp_path / "out").exists()


def _truncate_weights(folder: Path) -> str:
    name = "model.safetensors"
    (folder / name).write_bytes((folder / name).read_bytes()[:1000])
    return name


def _config_not_json(folder: Path) -> str:
    (folder / "config.json").write_text("{not json")
    return "config.json"


@pytest.mark.parametrize(
    "damage, expected",
    [(_truncate_weights, "SafetensorError"), (_config_not_json, "config.json")],
    ids=["truncated-safetensors", "config-not-json"],
)
def test_a_damaged_model_directory_with_a_matching_manifest_is_refused(finished_run, tmp_path, capsys, damage, expected):
    cfg, run = finished_run
    actor = _copy(run / "iter-0001" / "update_actor" / "actor", tmp_path / "actor")
    name = damage(actor)
    (actor / storage.MANIFEST).write_text(resealed(_manifest(actor), name, (actor / name).read_bytes()))
    argv = [
        "stage", "generate_chunks", "--config", config_yaml(cfg, tmp_path), "--iteration", "2",
        "--in", f"problems={run / 'bootstrap' / 'problems'}",
        "--in", f"prefixes={run / 'iter-0001' / 'sample_prefixes' / 'prefixes'}",
        "--in", f"actor={actor}", "--out", f"chunks={tmp_path / 'out' / 'chunks'}",
    ]  # fmt: skip
    assert main(argv) == exits.FAILED
    err = capsys.readouterr().err
    assert err.startswith(f"ac2: {actor}: cannot load this actor model directory (") and expected in err, err
    assert err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_state_file_that_is_not_json_is_refused_naming_the_checkpoint(finished_run, tmp_path):
    from ac2_core.models.state import STATE, read_version

    _, run = finished_run
    actor = _copy(run / "bootstrap" / "actor", tmp_path / "actor")
    (actor / STATE).write_bytes(b"\xff\xfe")
    (actor / storage.MANIFEST).write_text(resealed(_manifest(actor), STATE, b"\xff\xfe"))
    with pytest.raises(ArtifactError, match=rf"^{actor}: ac2_state.json is not JSON"):
        read_version(str(actor), kind="actor")


# ------------------------------------------------------------ generated cases

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def _paths(value, prefix=()):
    """Every key path of a parsed JSON value (dicts and lists), the root included."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _set(root, path, value, *, delete=False):
    if not path:
        return value
    parent = root
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return root


@st.composite
def mutated_manifests(draw, base: dict):
    """``base`` with one to three mutations: a value replaced by any JSON, a key deleted or added,
    a key renamed; or, once in a while, text that is not a manifest at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(st.binary(max_size=40).map(lambda b: b.decode("latin-1")), _JSON.map(json.dumps)))
    body = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(body))
        path = draw(st.sampled_from(paths))
        match draw(st.sampled_from(["replace", "delete", "add", "rename"])):
            case "replace":
                body = _set(body, path, draw(_JSON))
            case "delete" if path:
                body = _set(body, path, None, delete=True)
            case "add":
                target = body
                for key in path:
                    target = target[key]
                if isinstance(target, dict):
                    target[draw(st.text(max_size=12))] = draw(_JSON)
            case "rename" if path and isinstance(path[-1], str):
                value = _set(body, path, None, delete=True) and None
                parent = body
                for key in path[:-1]:
                    parent = parent[key]
                parent[draw(st.text(max_size=12))] = value
            case _:
                pass
    return json.dumps(body)


@pytest.fixture(scope="module")
def table_artifact(finished_run, tmp_path_factory):
    _, run = finished_run
    src = run / "iter-0001" / "score_chunks" / "critic_pairs"
    return src, storage.read_table(str(src), kind="critic_pairs")


@settings(max_examples=200)
@given(data=st.data())
def test_a_mutated_manifest_reads_as_the_same_table_or_is_refused_naming_the_artifact(table_artifact, tmp_path, data):
    src, table = table_artifact
    uri = tmp_path / "critic_pairs"
    if not uri.exists():
        _copy(src, uri)
    text = data.draw(mutated_manifests(_manifest(src)))
    (uri / storage.MANIFEST).write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        got = storage.read_table(str(uri), kind="critic_pairs")
    except ArtifactError as e:
        assert str(e).startswith(f"{uri}: "), e
    else:
        assert got.equals(table)


def _damage_bytes(data: bytes, kind: str, at: int, value: bytes) -> bytes:
    at %= max(len(data), 1)
    match kind:
        case "truncate":
            return data[:at]
        case "flip":
            return data[:at] + bytes([data[at] ^ (value[0] or 1)]) + data[at + 1 :]
        case "insert":
            return data[:at] + value + data[at:]
        case _:  # replace
            return value


_BYTE_DAMAGE = st.tuples(
    st.sampled_from(["truncate", "flip", "insert", "replace"]), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=64)
)


@settings(max_examples=200)
@given(damage=_BYTE_DAMAGE, other=st.booleans())
def test_damaged_table_bytes_under_a_matching_manifest_are_read_whole_or_refused_naming_the_artifact(
    table_artifact, tmp_path, damage, other
):
    src, _ = table_artifact
    uri = tmp_path / "critic_pairs"
    _copy(src, uri)
    data = (uri / storage.DATA).read_bytes()
    if other:  # a readable Parquet file of another shape: a column dropped, one of another type
        t = pq.read_table(uri / storage.DATA)
        t = (
            t.drop_columns([t.column_names[damage[1] % t.num_columns]])
            if damage[0] != "flip"
            else t.cast(
                pa.schema([f.with_type(pa.string()) if i == damage[1] % t.num_columns else f for i, f in enumerate(t.schema)])
            )
        )
        sink = pa.BufferOutputStream()
        pq.write_table(t, sink)
        data = sink.getvalue().to_pybytes()
    else:
        data = _damage_bytes(data, *damage)
    (uri / storage.DATA).write_bytes(data)
    (uri / storage.MANIFEST).write_text(resealed(_manifest(uri), storage.DATA, data))
    try:
        got = storage.read_table(str(uri), kind="critic_pairs")
    except ArtifactError as e:
        assert str(e).startswith(f"{uri}: "), e
    else:  # damage Parquet cannot notice (a flipped value byte): still a whole table of the declared schema
        assert got.num_rows == storage.read_manifest(str(uri)).rows


@pytest.fixture(scope="module")
def model_artifact(finished_run):
    cfg, run = finished_run
    src = run / "iter-0001" / "update_actor" / "actor"
    return cfg, src, sorted(storage.read_manifest(str(src)).files)


@settings(max_examples=40)
@given(data=st.data(), damage=_BYTE_DAMAGE)
def test_a_damaged_model_file_under_a_matching_manifest_loads_or_is_refused_naming_the_artifact(
    model_artifact, tmp_path, data, damage
):
    cfg, src, files = model_artifact
    name = data.draw(st.sampled_from(files))
    uri = _copy(src, tmp_path / "actor")
    damaged = _damage_bytes((uri / name).read_bytes(), *damage)
    (uri / name).write_bytes(damaged)
    (uri / storage.MANIFEST).write_text(resealed(_manifest(uri), name, damaged))
    store = ModelStore(cfg)
    try:
        ckpt = store.load(str(uri), kind="actor")
        store.tokenizer(str(uri), kind="actor")
        store.trainer(ckpt)  # the optimizer state
    except ArtifactError as e:
        assert str(e).startswith(f"{uri}: "), e


@settings(max_examples=12)
@given(damage=_BYTE_DAMAGE)
def test_a_stage_given_a_damaged_table_writes_nothing(finished_run, tmp_path, damage):
    cfg, run = finished_run
    pairs = _copy(run / "iter-0001" / "score_chunks" / "critic_pairs", tmp_path / "critic_pairs")
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    data = _damage_bytes((pairs / storage.DATA).read_bytes(), *damage)
    (pairs / storage.DATA).write_bytes(data)
    if damage[0] != "replace":  # a replaced file keeps the old manifest: the hash check refuses it
        (pairs / storage.MANIFEST).write_text(resealed(_manifest(pairs), storage.DATA, data))
    code = main(_check_readiness(cfg, run, tmp_path, pairs))
    assert code in (0, exits.FAILED)
    if code == exits.FAILED:
        assert not (tmp_path / "out").exists()
