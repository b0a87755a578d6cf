"""Artifacts on S3 (SeaweedFS on loopback): published whole, verified on read, refused with a message.

Every case goes through the real ``ac2_core.storage`` functions; what is on the server is
inspected, and tampered with, through a plain s3fs client (``S3.objects``, ``server.client()``).
Each bad input ends in an ArtifactError that names the URI, writes nothing, and leaves the
artifacts written before it readable.
"""

from __future__ import annotations

import hashlib
import json
import logging

import pyarrow as pa
import pytest
import torch
from safetensors.torch import save_file

from ac2_core import storage
from ac2_core.config import ConfigError, StorageConfig, parse_config
from ac2_core.storage import ArtifactError
from tests.storage.test_local_artifacts import CFG_HASH, _pairs, _write_pairs, resealed


def _key(uri: str) -> str:
    return uri.removeprefix("s3://")


def _publish_model(uri: str, shards: dict[str, int], extra: dict[str, bytes] | None = None, *, seed: int = 0) -> None:
    """Publish a model folder: safetensors shards of ``n`` float32 values each, plus ``extra`` files."""
    gen = torch.Generator().manual_seed(seed)
    with storage.publish_dir(uri, kind="actor", stage="update_actor", config_hash=CFG_HASH) as staging:
        for name, n in shards.items():
            save_file({"w": torch.randn(n, generator=gen)}, str(staging / name))
        for name, data in (extra or {}).items():
            (staging / name).write_bytes(data)


def _rewrite_manifest_hash(server, uri: str, name: str) -> None:
    """Make the manifest on the server agree with the file ``name`` as it now is there."""
    fs = server.client()
    manifest = json.loads(fs.cat_file(f"{_key(uri)}/manifest.json"))
    fs.pipe_file(f"{_key(uri)}/manifest.json", resealed(manifest, name, fs.cat_file(f"{_key(uri)}/{name}")).encode())


# ------------------------------------------------------------------ round trips


def test_table_round_trip_on_s3_matches_the_same_table_written_locally(s3, tmp_path):
    uri = s3.uri("it-2", "critic_pairs")
    manifest = _write_pairs(uri)

    assert storage.exists(uri)
    assert storage.read_rows(uri, kind="critic_pairs") == _pairs()
    assert storage.read_manifest(uri) == manifest
    assert s3.objects(uri) == ["data.parquet", "manifest.json"]
    # the same bytes as on a local disk: the manifest holds no timestamp and no location
    with storage.using(StorageConfig()):  # a local path is outside this test's artifact root
        _write_pairs(str(tmp_path / "critic_pairs"))
    assert storage.content_hash(uri) == storage.content_hash(str(tmp_path / "critic_pairs"))
    assert s3.server.client().cat_file(f"{_key(uri)}/manifest.json") == (tmp_path / "critic_pairs" / "manifest.json").read_bytes()


def test_endpoint_and_region_may_come_from_the_environment_alone(s3, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.server.endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with storage.using(StorageConfig()):  # no endpoint in the config
        _write_pairs(s3.uri("t"))
        assert storage.read_rows(s3.uri("t"), kind="critic_pairs") == _pairs()


def test_rewriting_a_model_on_s3_leaves_no_file_of_the_old_version(s3):
    uri = s3.uri("actor")
    _publish_model(uri, {"model-00001.safetensors": 64, "model-00002.safetensors": 64}, {"old.json": b"{}"})
    assert s3.objects(uri) == ["manifest.json", "model-00001.safetensors", "model-00002.safetensors", "old.json"]

    _publish_model(uri, {"model.safetensors": 32}, {"config.json": b"{}"}, seed=1)

    assert s3.objects(uri) == ["config.json", "manifest.json", "model.safetensors"]
    assert sorted(storage.read_manifest(uri).files) == ["config.json", "model.safetensors"]


def test_exception_inside_publish_dir_on_s3_keeps_the_previous_artifact(s3):
    uri = s3.uri("critic_pairs")
    _write_pairs(uri)
    before = storage.content_hash(uri)
    with pytest.raises(RuntimeError, match="stage crashed"):
        with storage.publish_dir(uri, kind="critic_pairs", stage="score_chunks", config_hash=CFG_HASH, rows=1) as staging:
            (staging / "data.parquet").write_bytes(b"half a file")
            raise RuntimeError("stage crashed")
    assert storage.content_hash(uri) == before
    assert storage.read_rows(uri, kind="critic_pairs") == _pairs()
    assert s3.objects(uri) == ["data.parquet", "manifest.json"]


def test_model_directory_round_trips_through_the_parallel_download(s3, tmp_path):
    uri = s3.uri("actor")
    shards = {f"model-{i:05d}-of-00004.safetensors": 50_000 for i in range(1, 5)}
    _publish_model(uri, shards | {"optimizer.safetensors": 100_000}, {"config.json": b'{"a": 1}'})

    folder = storage.local_model_dir(uri, kind="actor", cache_dir=str(tmp_path))

    manifest = storage.read_manifest(uri)
    assert folder == tmp_path / "ac2-models" / manifest.content_hash
    assert sorted(p.name for p in folder.iterdir()) == sorted([*manifest.files, "manifest.json"])
    fs = s3.server.client()
    for name in manifest.files:
        assert (folder / name).read_bytes() == fs.cat_file(f"{_key(uri)}/{name}"), name
    assert [p.name for p in (tmp_path / "ac2-models").iterdir()] == [manifest.content_hash]  # no staging left
    # A second call is served from the verified cache.
    stamp = (folder / "config.json").stat().st_mtime_ns
    assert storage.local_model_dir(uri, kind="actor", cache_dir=str(tmp_path)) == folder
    assert (folder / "config.json").stat().st_mtime_ns == stamp
    with pytest.raises(ArtifactError, match="expected a critic model, found a actor artifact"):
        storage.local_model_dir(uri, kind="critic", cache_dir=str(tmp_path))


def test_model_files_are_hashed_in_the_transfer_not_in_a_pass_of_their_own(s3, tmp_path, monkeypatch):
    # uploads hash beside the transfer (the manifest still lists the sha256 of what the server holds);
    # downloads hash as the bytes arrive, with no pass over the file after it, and still refuse a changed file
    from ac2_core.storage import models

    shards = {"model.safetensors": 300_000, "optimizer.safetensors": 600_000}  # several chunks each
    uri = s3.uri("actor")
    _publish_model(uri, shards, {"config.json": b"{}"})
    manifest = storage.read_manifest(uri)
    fs = s3.server.client()
    for name, entry in manifest.files.items():
        assert entry["sha256"] == hashlib.sha256(fs.cat_file(f"{_key(uri)}/{name}")).hexdigest(), name

    def no_second_pass(path):
        raise AssertionError(f"{path} hashed apart from its download")

    monkeypatch.setattr(models, "sha256_file", no_second_pass)
    folder = storage.local_model_dir(uri, kind="actor", cache_dir=str(tmp_path / "a"))
    for name in manifest.files:
        assert (folder / name).read_bytes() == fs.cat_file(f"{_key(uri)}/{name}"), name
    data = bytearray(fs.cat_file(f"{_key(uri)}/optimizer.safetensors"))
    data[-1] ^= 1
    fs.pipe_file(f"{_key(uri)}/optimizer.safetensors", bytes(data))
    with pytest.raises(ArtifactError, match=f"{uri}: optimizer.safetensors does not match its manifest"):
        storage.local_model_dir(uri, kind="actor", cache_dir=str(tmp_path / "b"))


def test_download_cache_keeps_only_the_most_recently_used_checkpoints(s3, tmp_path):
    # One checkpoint per "iteration", each a different model: a long run must not fill the disk.
    uris = [s3.uri(f"iter-{i}", "actor") for i in range(4)]
    for i, uri in enumerate(uris):
        _publish_model(uri, {"model.safetensors": 64}, seed=i)
    cache = tmp_path / "ac2-models"
    with storage.using(s3.section.model_copy(update={"model_cache_entries": 2})):
        first = storage.local_model_dir(uris[0], kind="actor", cache_dir=str(tmp_path))
        storage.local_model_dir(uris[1], kind="actor", cache_dir=str(tmp_path))
        assert storage.local_model_dir(uris[0], kind="actor", cache_dir=str(tmp_path)) == first  # used again: newest
        newest = storage.local_model_dir(uris[2], kind="actor", cache_dir=str(tmp_path))
        # uris[1] was the least recently used of three; the bound is 2
        assert sorted(p.name for p in cache.iterdir()) == sorted([first.name, newest.name])
        last = storage.local_model_dir(uris[3], kind="actor", cache_dir=str(tmp_path))
        assert sorted(p.name for p in cache.iterdir()) == sorted([newest.name, last.name])
    assert (last / "model.safetensors").exists()


def test_remove_deletes_every_object_of_an_artifact(s3):
    _publish_model(s3.uri("a"), {"model.safetensors": 16})
    _publish_model(s3.uri("ab"), {"model.safetensors": 16})  # a prefix of the name is another artifact
    storage.remove(s3.uri("a"))
    assert not storage.exists(s3.uri("a")) and s3.objects(s3.uri("a")) == []
    assert storage.exists(s3.uri("ab"))
    storage.remove(s3.uri("never-written"))  # nothing to do is not an error


# ---------------------------------------------------------------- refused reads


def test_data_that_does_not_match_its_manifest_on_s3_is_refused(s3):
    uri, other = s3.uri("critic_pairs"), s3.uri("earlier")
    _write_pairs(other)
    _write_pairs(uri)
    fs = s3.server.client()
    data = bytearray(fs.cat_file(f"{_key(uri)}/data.parquet"))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(f"{_key(uri)}/data.parquet", bytes(data))

    with pytest.raises(ArtifactError) as err:
        storage.read_table(uri, kind="critic_pairs")
    assert f"{uri}: data.parquet does not match its manifest" in str(err.value)
    assert s3.objects(s3.root) == sorted(
        f"{a}/{f}" for a in ("critic_pairs", "earlier") for f in ("data.parquet", "manifest.json")
    )
    assert storage.read_rows(other, kind="critic_pairs") == _pairs()


def test_truncated_parquet_on_s3_is_refused_as_unreadable(s3):
    uri, other = s3.uri("critic_pairs"), s3.uri("earlier")
    _write_pairs(other)
    _write_pairs(uri)
    fs = s3.server.client()
    data = fs.cat_file(f"{_key(uri)}/data.parquet")
    fs.pipe_file(f"{_key(uri)}/data.parquet", data[: len(data) // 2])
    _rewrite_manifest_hash(s3.server, uri, "data.parquet")  # so that Parquet itself is reached

    with pytest.raises(ArtifactError) as err:
        storage.read_table(uri, kind="critic_pairs")
    assert f"{uri}: data.parquet is not a readable Parquet file" in str(err.value)
    assert storage.read_rows(other, kind="critic_pairs") == _pairs()


def test_manifest_missing_on_s3_means_never_published(s3):
    uri = s3.uri("critic_pairs")
    _write_pairs(uri)
    s3.server.client().rm_file(f"{_key(uri)}/manifest.json")
    assert not storage.exists(uri)
    with pytest.raises(ArtifactError, match="never published whole"):
        storage.read_table(uri, kind="critic_pairs")
    with pytest.raises(ArtifactError, match="no artifact at this URI"):
        storage.read_table(s3.uri("nothing"), kind="critic_pairs")


def test_model_directory_with_only_a_pickle_is_refused_and_nothing_is_cached(s3, tmp_path):
    good, bad = s3.uri("actor-good"), s3.uri("actor-pickle")
    _publish_model(good, {"model.safetensors": 16})
    with storage.publish_dir(bad, kind="actor", stage="update_actor", config_hash=CFG_HASH) as staging:
        (staging / "pytorch_model.bin").write_bytes(b"\x80\x02pickle")
        (staging / "config.json").write_bytes(b"{}")

    with pytest.raises(ArtifactError) as err:
        storage.local_model_dir(bad, kind="actor", cache_dir=str(tmp_path / "cache"))
    assert f"{bad}: pickle-format file(s) pytorch_model.bin; ac2 loads safetensors only" in str(err.value)
    assert not (tmp_path / "cache").exists()
    assert storage.local_model_dir(good, kind="actor", cache_dir=str(tmp_path / "cache")).is_dir()


def test_pickle_put_beside_a_published_model_on_s3_is_refused(s3, tmp_path):
    uri = s3.uri("actor")
    _publish_model(uri, {"model.safetensors": 16})
    s3.server.client().pipe_file(f"{_key(uri)}/pytorch_model.bin", b"\x80\x02pickle")
    with pytest.raises(ArtifactError, match="pickle-format file.*pytorch_model.bin"):
        storage.local_model_dir(uri, kind="actor", cache_dir=str(tmp_path))
    assert not (tmp_path / "ac2-models").exists() or not any((tmp_path / "ac2-models").iterdir())


def test_changed_weights_on_s3_are_refused_and_not_cached(s3, tmp_path):
    uri = s3.uri("actor")
    _publish_model(uri, {"model.safetensors": 16, "model-2.safetensors": 16})
    fs = s3.server.client()
    save_file({"w": torch.zeros(16)}, str(tmp_path / "zeros.safetensors"))
    fs.put_file(str(tmp_path / "zeros.safetensors"), f"{_key(uri)}/model-2.safetensors")
    with pytest.raises(ArtifactError, match=f"{uri}: model-2.safetensors does not match its manifest"):
        storage.local_model_dir(uri, kind="actor", cache_dir=str(tmp_path / "cache"))
    assert list((tmp_path / "cache" / "ac2-models").iterdir()) == []  # the staging folder is gone too


# --------------------------------------------------------------- refused writes


def test_wrong_schema_on_s3_writes_nothing_and_keeps_the_earlier_artifact(s3):
    uri = s3.uri("critic_pairs")
    _write_pairs(uri)
    before = storage.content_hash(uri)
    table = storage.table_from_rows(_pairs(5), "critic_pairs").drop_columns(["outcome"])
    with pytest.raises(ArtifactError, match=f"{uri}: critic_pairs table is missing column.*outcome"):
        storage.write_table(uri, table, kind="critic_pairs", stage="score_chunks", config_hash=CFG_HASH)
    assert storage.content_hash(uri) == before
    assert storage.read_rows(uri, kind="critic_pairs") == _pairs()
    with pytest.raises(ArtifactError, match="column iteration of critic_pairs should be int32, found string"):
        t = storage.table_from_rows(_pairs(), "critic_pairs")
        t = t.set_column(t.schema.get_field_index("iteration"), "iteration", pa.array(["2"] * 3))
        storage.write_table(s3.uri("fresh"), t, kind="critic_pairs", stage="s", config_hash=CFG_HASH)
    assert s3.objects(s3.root) == ["critic_pairs/data.parquet", "critic_pairs/manifest.json"]


@pytest.mark.parametrize(
    "where",
    [
        "s3://{bucket}/elsewhere/critic_pairs",
        "{root}-sibling/critic_pairs",
        "{root}/../escape/critic_pairs",
        "{tmp}/critic_pairs",
    ],
)
def test_uri_outside_the_artifact_root_is_refused_before_anything_is_written(s3, tmp_path, where):
    _write_pairs(s3.uri("earlier"))
    uri = where.format(bucket=s3.server.bucket, root=s3.root, tmp=tmp_path)
    with pytest.raises(ArtifactError) as err:
        _write_pairs(uri)
    assert str(err.value).startswith(uri)
    assert "artifact root" in str(err.value) or "'..'" in str(err.value)
    with pytest.raises(ArtifactError) as err:
        storage.remove(uri)
    assert str(err.value).startswith(uri)
    assert s3.objects(f"s3://{s3.server.bucket}/elsewhere") == []
    assert s3.objects(s3.root + "-sibling") == []
    assert list(tmp_path.iterdir()) == []
    assert s3.objects(s3.root) == ["earlier/data.parquet", "earlier/manifest.json"]


@pytest.mark.parametrize("unset", ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "both"])
def test_missing_credentials_are_named_and_nothing_is_written(s3, monkeypatch, unset):
    _write_pairs(s3.uri("earlier"))
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if unset == "both" else (unset,):
        monkeypatch.delenv(var)
    uri = s3.uri("critic_pairs")
    with pytest.raises(ArtifactError) as err:
        _write_pairs(uri)
    message = str(err.value)
    assert message.startswith(f"{uri}: ")
    assert "AWS_ACCESS_KEY_ID" in message and "AWS_SECRET_ACCESS_KEY" in message
    assert s3.server.secret_key not in message and s3.server.access_key not in message
    with pytest.raises(ArtifactError, match="credentials"):
        storage.read_table(s3.uri("earlier"), kind="critic_pairs")
    assert s3.objects(s3.root) == ["earlier/data.parquet", "earlier/manifest.json"]


def test_wrong_credentials_are_refused_at_once_without_retries(s3, monkeypatch, caplog):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    uri = s3.uri("critic_pairs")
    with caplog.at_level(logging.WARNING, logger="ac2_core.storage"), pytest.raises(ArtifactError) as err:
        _write_pairs(uri)
    assert not [r for r in caplog.records if "retry" in r.getMessage()]  # every retry logs one; none was made
    assert str(err.value).startswith(f"{uri}: ") and "refused by" in str(err.value)
    assert "not-the-secret" not in str(err.value)


def test_the_config_has_no_place_for_credentials():
    with pytest.raises(ConfigError, match="storage.secret_access_key: unknown key"):
        parse_config({"storage": {"secret_access_key": "s3cr3t"}})
    with pytest.raises(ConfigError) as err:
        parse_config({"storage": {"endpoint_url": "http://user:s3cr3t@minio:9000"}})
    assert "storage.endpoint_url" in str(err.value) and "s3cr3t" not in str(err.value)
    # where artifacts live is not part of what the run computes
    assert parse_config({"storage": {"endpoint_url": "http://minio:9000"}}).config_hash() == parse_config({}).config_hash()
