"""A run a user can trust and watch (issue 15), on one 3-iteration inprocess run of the tiny model:
the recorded config and the resume checks, lineage in every manifest, the training statistics
and samples, TensorBoard and MLflow read back, the checkpoint policy, and the multi-run report."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from ac2_core import storage
from ac2_core.config import load_config
from ac2_core.runner import inprocess, loop, record
from ac2_core.runner.layout import RunLayout
from ac2_core.runner.lineage import chain
from ac2_core.runner.timings import read_timings
from pipelines.cli import main
from tests.conftest import tiny_config

STAGES = ("sample_prefixes", "generate_chunks", "score_chunks", "check_readiness", "update_actor", "update_critic", "evaluate")


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """(config file, run folder, rows, console lines, MLflow URI) of a finished 3-iteration run."""
    base = tmp_path_factory.mktemp("watch")
    mlflow_uri = f"file:{base / 'mlruns'}"
    # actor.lr pinned: the resume and MLflow tests name its recorded value
    cfg = tiny_config(run__iterations=3, run__keep_models=1, actor__lr=3e-5, tracking__mlflow_uri=mlflow_uri)
    config = base / "tiny.yaml"
    config.write_text(record.config_yaml(cfg))
    out = base / "run"
    lines: list[str] = []
    rows = inprocess.run(cfg, str(out), log=lines.append, tty=False)
    return config, out, rows, lines, mlflow_uri


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_run_folder_records_its_config_and_the_rows_name_algorithm_and_hash(watched):
    config, out, rows, _, _ = watched
    recorded = load_config(out / "config.yaml")
    assert recorded == load_config(config)
    # `ac2 stage --config <run>/config.yaml` gets the hash the run's manifests carry, --iterations and all
    made = storage.read_manifest(str(out / "iter-0003" / "evaluate" / "metrics")).config_hash
    assert recorded.config_hash() == made
    # the rows' config hash leaves out the run length: one value for the run, however long
    longer = load_config(config, {"run.iterations": 7})
    assert rows[-1]["config_hash"] == recorded.run_hash() == longer.run_hash()
    assert longer.config_hash() != recorded.config_hash()
    assert [r["algorithm"] for r in rows] == ["bootstrap", "ac2", "ac2", "ac2"]


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--set", "actor.lr=1e-3"], "actor.lr: recorded 3e-05, now 0.001"),
        (["--set", "algorithm=grpo"], "algorithm: recorded 'ac2', now 'grpo'"),
        (["--resume", "never"], "--resume is never"),
    ],
)
def test_a_resume_with_another_config_stops_before_anything_and_names_the_fields(watched, capsys, flags, named):
    config, out, _, _, _ = watched
    before = _snapshot(out)
    assert main(["run", "--config", str(config), "--out", str(out), "--runner", "inprocess", *flags]) == 3
    err = capsys.readouterr().err.strip()
    assert named in err and "\n" not in err
    assert _snapshot(out) == before


def test_a_resume_may_change_the_run_length_what_is_kept_and_where_and_on_how_many_processes_it_runs():
    recorded = tiny_config()
    settled = {"run__iterations": 9, "run__keep_models": 5, "run__keep_best": False, "model__device": "cpu"}
    settled |= {"training__num_processes": 2, "generation__num_processes": 2, "tracking__tensorboard": False}
    now = tiny_config(**settled)
    assert record.differences(recorded, now) == [] and now.run_hash() == recorded.run_hash()
    # what is computed is not among them, on any number of processes
    g = recorded.rollout.group_size
    other = tiny_config(**settled, rollout__group_size=g - 1)
    assert record.differences(recorded, other) == [f"rollout.group_size: recorded {g}, now {g - 1}"]


def test_fewer_iterations_than_done_says_so_and_changes_nothing(watched, capsys):
    config, out, _, _, _ = watched
    before = _snapshot(out)
    assert main(["run", "--config", str(config), "--out", str(out), "--runner", "inprocess", "--iterations", "2"]) == 0
    assert "holds 3 finished iterations and run.iterations is 2: nothing to run" in capsys.readouterr().out
    assert _snapshot(out) == before


def test_every_manifest_names_its_inputs_relative_to_the_run_folder_and_lineage_reaches_the_bootstrap(watched, tmp_path, capsys):
    _, out, _, _, _ = watched
    for uri in storage.find_artifacts(str(out)):
        lineage = storage.read_manifest(uri).lineage
        assert lineage is not None, uri
        for entry in lineage["inputs"].values():
            assert not entry["uri"].startswith("/") and "://" not in entry["uri"], uri
    # moved elsewhere whole, the run folder's chain still resolves
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    lines = chain(str(moved / "iter-0003" / "evaluate" / "metrics"))
    assert lines[0].startswith("iter-0003/evaluate/metrics  [metrics by evaluate, iteration 3")
    assert any(line.startswith("bootstrap/problems  [problems by bootstrap") for line in lines)
    assert any(line.startswith("iter-0001/sample_prefixes/prefixes") for line in lines)
    assert not any("changed:" in line for line in lines)
    # the pruned checkpoint of iteration 2 (keep_models 1, best at iteration 1) is reported gone
    assert any("<- actor: iter-0002/update_actor/actor" in line and "gone" in line for line in lines)
    # the command: --depth 0 stays within the artifact's own iteration
    assert main(["lineage", str(moved / "iter-0003" / "evaluate" / "metrics"), "--depth", "0"]) == 0
    shown = [line for line in capsys.readouterr().out.splitlines() if not line.startswith(" ")]
    assert shown[0].startswith("iter-0003/evaluate/metrics") and all(line.startswith("iter-0003/") for line in shown)


def test_training_statistics_seconds_and_samples(watched):
    _, out, rows, lines, _ = watched
    trained = rows[1:]
    assert all(r["entropy"] is not None and r["entropy"] > 0 for r in trained)
    assert all(r["critic_loss"] is not None and r["critic_loss"] > 0 for r in trained)
    actor = [r for r in trained if r["actor_loss"] is not None]
    assert actor and all(0 <= r["clip_fraction"] <= 1 and r["grad_norm"] >= 0 and r["kl"] >= 0 for r in actor)
    # the console row shows them: the entropy of iteration 3 is on its line
    row3 = next(line for line in lines if line.lstrip().startswith("3 "))
    assert f"{rows[3]['entropy']:7.3f}" in row3 and "[3/3, elapsed" in row3
    assert set(read_timings(str(out))[3]) == set(STAGES)
    assert "| seconds |" in (out / "summary.md").read_text()
    samples = storage.read_rows(str(out / "iter-0003" / "evaluate" / "samples"), kind="samples")
    assert 1 <= len(samples) <= 4 and {s["mode"] for s in samples} <= {"full", "chunk"}
    assert all(s["prompt"] and isinstance(s["answer"], str) for s in samples)


def test_tensorboard_and_mlflow_hold_the_scalars(watched):
    _, out, rows, _, mlflow_uri = watched
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    scores = [(e.step, e.value) for e in events.Scalars("eval/val_score")]
    assert scores == [(r["iteration"], pytest.approx(r["val_score"])) for r in rows]
    assert [e.step for e in events.Scalars("time/update_actor_s")] == [1, 2, 3]
    client = MlflowClient(tracking_uri=mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("ac2").experiment_id])
    history = client.get_metric_history(run.info.run_id, "actor/entropy")
    assert sorted((m.step, m.value) for m in history) == [(r["iteration"], pytest.approx(r["entropy"])) for r in rows[1:]]
    assert run.data.params["actor.lr"] == "3e-05" and run.data.tags["algorithm"] == "ac2"


def test_the_best_checkpoint_is_kept_with_the_last(watched):
    _, out, rows, _, _ = watched
    layout = RunLayout(str(out))
    best = loop.best_iteration(rows)
    kept = {it for it in (1, 2, 3) if storage.exists(layout.output(it, "actor"))}
    assert kept == {best, 3}


def test_prune_keeps_the_best_by_validation_score_plus_the_last_n(tmp_path):
    cfg = tiny_config(run__keep_models=2)
    layout = RunLayout(str(tmp_path))
    scores = [0.1, 0.5, None, 0.2, 0.6, 0.3, 0.1]
    rows = [{"iteration": 0, "val_score": 0.0}]
    for it, score in enumerate(scores, start=1):
        for name in ("actor", "critic"):
            with storage.publish_dir(layout.output(it, name), kind=name, stage="test", config_hash="x") as folder:
                (folder / "w").write_text(str(it))
        rows.append({"iteration": it, "val_score": score})
        loop.prune(cfg, layout, it, rows)
    assert {it for it in range(1, 8) if storage.exists(layout.output(it, "actor"))} == {5, 6, 7}
    assert {it for it in range(1, 8) if storage.exists(layout.output(it, "critic"))} == {5, 6, 7}
    loop.prune(tiny_config(run__keep_models=1, run__keep_best=False), layout, 7, rows)
    assert {it for it in range(1, 8) if storage.exists(layout.output(it, "actor"))} == {5, 7}  # 6 left the last 1


def test_report_plots_several_runs_in_one_figure(watched, tmp_path, capsys):
    _, out, rows, _, _ = watched
    other = tmp_path / "other"
    shutil.copytree(out, other)
    assert main(["report", str(out), str(other), "--out", str(tmp_path / "cmp")]) == 0
    assert (tmp_path / "cmp" / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "cmp" / "report.md").read_text()
    assert md.startswith("# run (ac2) vs other (ac2)") and md.count("| 3 |") == 2 and "Samples of iteration 3" in md


def test_a_longer_run_resumes_and_the_record_takes_its_length(watched, tmp_path, capsys):
    config, out, _, _, _ = watched
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    assert main(["run", "--config", str(config), "--out", str(copy), "--runner", "inprocess", "--iterations", "4"]) == 0
    assert f"resuming {copy} after iteration 3" in capsys.readouterr().out
    assert yaml.safe_load((copy / "config.yaml").read_text())["run"]["iterations"] == 4
    assert RunLayout(str(copy)).completed_iterations() == 4
