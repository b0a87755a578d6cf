"""A whole local training run with every artifact on S3 (SeaweedFS on loopback).

The inprocess runner gets an ``s3://`` out_dir and the endpoint in ``cfg.storage``; the
credentials are only in the environment. Two stages are then run again on their own, in a
fresh ModelStore that downloads the checkpoints from S3, and must publish the same content.
"""

from __future__ import annotations

import dataclasses
import tempfile

import pytest
import yaml

from ac2_core import storage
from ac2_core.runner import inprocess, loop
from ac2_core.runner.layout import RunLayout
from ac2_core.runner.lineage import chain
from ac2_core.stages.recipe import ITERATION
from pipelines.cli import main
from tests.conftest import tiny_config


def _cfg(s3, **overrides):
    section = s3.section.model_dump()
    return tiny_config(**{f"storage__{k}": v for k, v in section.items()}, **overrides)


def _rerun(cfg, layout: RunLayout, iteration: int, stage: str, out_root: str) -> dict[str, str]:
    """Run ``stage`` of ``iteration`` again on the run's inputs; its outputs go under ``out_root``."""
    call = next(c for c in inprocess.stage_calls(cfg, layout, iteration) if c.stage == stage)
    outputs = {k: storage.join(out_root, k.removeprefix("out_")) for k in call.kwargs if k.startswith("out_")}
    dataclasses.replace(call, kwargs=call.kwargs | outputs).run(cfg)
    return {k.removeprefix("out_"): uri for k, uri in outputs.items()}


@pytest.mark.slow
def test_two_iterations_with_every_artifact_on_s3_and_a_stage_rerun_gives_the_same_hash(s3, tmp_path, monkeypatch):
    # Staging and model downloads go to this test's folder: nothing comes from an earlier cache.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg = _cfg(s3)
    out = s3.uri("run")
    rows = inprocess.run(cfg, out, log=lambda _: None)

    assert rows[-1]["iteration"] == 2
    layout = RunLayout(out)
    expected = [layout.bootstrap(n) for n in ("problems", "actor", "critic", "replay", "scored_chunks", "readiness", "metrics")]
    expected += [layout.output(it, name) for it in (1, 2) for stage in ITERATION for name in stage.outputs]
    for uri in expected:
        assert uri.startswith("s3://") and storage.exists(uri), uri
    # every object of the run belongs to a published artifact, and is listed in its manifest, but for
    # the run folder's plain files: the recorded config, the summary, timings and TensorBoard's events
    objects = set(s3.objects(out))
    listed = set()
    for uri in expected:
        prefix = uri.removeprefix(out + "/")
        listed |= {f"{prefix}/{name}" for name in [*storage.read_manifest(uri).files, storage.MANIFEST]}
    plain = objects - listed
    assert listed <= objects
    events = {p for p in plain if p.startswith("tensorboard/events.out.tfevents.")}
    assert events and plain - events == {"config.yaml", "summary.md", "timings.json"}

    # Stages rerun on their own, as a KFP component would run them: the runner's part is to
    # make cfg.storage active. score_chunks gets a fresh ModelStore and downloads its models.
    with storage.using(cfg.storage):
        for stage in ("score_chunks", "check_readiness"):
            again = _rerun(cfg, layout, 2, stage, s3.uri("rerun", stage))
            for name, uri in again.items():
                assert storage.content_hash(uri) == storage.content_hash(layout.output(2, name)), (stage, name)

    # The same through the command line: ac2 stage reads and writes s3:// URIs itself.
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    kwargs = next(c for c in inprocess.stage_calls(cfg, layout, 2) if c.stage == "generate_chunks").kwargs
    cli_out = s3.uri("cli", "chunks")
    args = ["stage", "generate_chunks", "--config", str(config), "--iteration", "2", "--out", f"chunks={cli_out}"]
    args += [a for k, v in kwargs.items() if not k.startswith("out_") for a in ("--in", f"{k}={v}")]
    assert main(args) == 0
    assert storage.content_hash(cli_out) == storage.content_hash(layout.output(2, "chunks"))

    # ac2 report and ac2 lineage on the s3:// run folder
    assert main(["report", out, "--config", str(config)]) == 0
    with storage.using(cfg.storage):
        assert storage.read_text(storage.join(out, "report.md")).startswith("# run (ac2)")
        lines = chain(layout.output(2, "metrics"))
    assert any(line.startswith("bootstrap/problems  [problems by bootstrap") for line in lines)
    assert "learning_curve.png" in s3.objects(out)

    with storage.using(cfg.storage):
        # The runner's pruning removes a checkpoint from S3 entirely.
        loop.prune(tiny_config(run__keep_models=1, run__keep_best=False), layout, 2, rows)
    for name in ("actor", "critic"):
        assert not storage.exists(layout.output(1, name))
        assert s3.objects(layout.output(1, name)) == []
        assert storage.exists(layout.output(2, name))
