"""The real pipelines through kfp.local on the tiny model: chained AC2 and GRPO runs,
single-stage re-runs, identity with the inprocess runner, resuming, and ``ac2 report``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kfp.local.logging_utils import indented_print

import ac2_core
from ac2_core import storage
from ac2_core.runner import inprocess, record, report
from ac2_core.runner.layout import RunLayout
from ac2_core.runner.timings import read_timings
from pipelines import local
from pipelines.cli import main
from tests.conftest import tiny_config
from tests.pipeline.conftest import config_file

BOOTSTRAP_OUTPUTS = ("problems", "actor", "critic", "replay", "scored_chunks", "readiness", "metrics")
ITERATION_OUTPUTS = {
    "sample_prefixes": ("replay", "prefixes"),
    "generate_chunks": ("chunks",),
    "score_chunks": ("scored_chunks", "critic_pairs"),
    "check_readiness": ("readiness", "advantages"),
    "update_actor": ("actor",),
    "update_critic": ("critic",),
    "evaluate": ("samples", "metrics"),
}


def kfp_run_dir(out: Path, label: str) -> Path:
    """The kfp.local pipeline run that wrote ``label`` (bootstrap, iter-0001, ...) of a kfp run folder."""
    return out / "kfp" / json.loads((out / "kfp" / "runs.json").read_text())["runs"][label]


def test_ac2_runs_two_chained_iterations(kfp_run, kfp_layout):
    cfg, out, rows, lines = kfp_run
    assert [r["iteration"] for r in rows if r["iteration"] > 0] == [1, 2]
    # every artifact at its name in the run folder (the inprocess runner's layout), none left under kfp/
    assert all(storage.exists(str(out / "bootstrap" / name)) for name in BOOTSTRAP_OUTPUTS)
    for it in (1, 2):
        for stage, names in ITERATION_OUTPUTS.items():
            for name in names:
                assert storage.read_manifest(str(out / f"iter-{it:04d}" / stage / name)).stage == stage
    assert storage.find_artifacts(str(out / "kfp")) == []
    assert rows == storage.read_rows(kfp_layout.output(2, "metrics"), kind="metrics")
    # the run folder records the resolved config, and TensorBoard's events, as the inprocess runner's does
    assert record.recorded_config(str(out)) == cfg
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    # each iteration's progress line is the inprocess runner's row format
    assert lines.count(report.HEADER) == 1
    assert sum(line.startswith(report.format_row(r)) for line in lines for r in rows if r["iteration"] > 0) == 2
    # iteration 2's tasks wrote what is in the run folder now, and carry its manifest and figures as KFP metadata
    run_dir = kfp_run_dir(out, "iter-0002")
    written = json.loads((run_dir / "update-actor" / "executor_output.json").read_text())
    actor = written["artifacts"]["out_actor"]["artifacts"][0]["metadata"]
    assert actor["policy_version"] == 2 and actor["content_hash"] == storage.content_hash(kfp_layout.output(2, "actor"))
    assert storage.read_manifest(kfp_layout.output(2, "actor")).stage == "update_actor"
    meta = json.loads((run_dir / "score-chunks" / "executor_output.json").read_text())["artifacts"]["out_scored_chunks"][
        "artifacts"
    ][0]["metadata"]
    assert meta["content_hash"] == storage.content_hash(kfp_layout.output(2, "scored_chunks"))
    assert meta["rows"] == meta["chunks"] > 0
    # iteration 2 imported what iteration 1 left in the run folder (lineage through dsl.importer)
    assert str(kfp_layout.output(1, "actor")) in (out / "kfp" / "logs" / "iter-0002.log").read_text()
    table = (run_dir / "evaluate" / "report").read_text()
    assert any(line.startswith("validation score:") for line in table.splitlines())
    figures = json.loads((run_dir / "evaluate" / "executor_output.json").read_text())["artifacts"]["figures"]["artifacts"][0][
        "metadata"
    ]
    assert figures["iteration"] == 2 and "cum_decode_flops" in figures
    # the KFP UI's scalars include the training statistics (KFP Metrics, read back from the run)
    assert figures["entropy"] == pytest.approx(rows[-1]["entropy"]) and figures["critic_loss"] > 0
    assert "## Samples of this iteration" in table
    # the logs hold no terminal escape codes; runs.json and the manifests name nothing outside the run folder
    assert not any("\x1b" in f.read_text() for f in (out / "kfp" / "logs").glob("*.log"))
    assert all("/" not in name for name in json.loads((out / "kfp" / "runs.json").read_text())["runs"].values())
    inputs = storage.read_manifest(kfp_layout.output(2, "metrics")).lineage["inputs"]
    assert inputs["actor"]["uri"] == "iter-0002/update_actor/actor" and inputs["metrics"]["uri"] == "iter-0001/evaluate/metrics"
    # seconds per stage, from the tasks' KFP metadata, outside the artifacts
    assert set(read_timings(str(out))[2]) == set(ITERATION_OUTPUTS)
    # every stage ran in a worker of the warm task host (the default); none fell back to a cold start
    assert "imports done" in (out / "kfp" / "logs" / "taskhost.log").read_text()
    assert not any("in the task's own process" in f.read_text() for f in (out / "kfp" / "logs").glob("iter-*.log"))


def test_finished_run_is_resumed_not_repeated(kfp_run):
    cfg, out, rows, _ = kfp_run
    before = sorted(p.name for p in (out / "kfp").iterdir())
    lines: list[str] = []
    assert local.run(cfg, str(out), log=lines.append) == rows
    assert sorted(p.name for p in (out / "kfp").iterdir()) == before
    assert any(line.startswith(f"resuming {out} after iteration 2") for line in lines)
    # another config stops before the task host or kfp.local writes anything, naming the field
    host_log = (out / "kfp" / "logs" / "taskhost.log").read_text()
    with pytest.raises(record.RunFolderError, match=r"differing: actor\.lr: recorded"):
        local.run(tiny_config(actor__lr=cfg.actor.lr * 2), str(out), log=lines.append)
    assert sorted(p.name for p in (out / "kfp").iterdir()) == before
    assert (out / "kfp" / "logs" / "taskhost.log").read_text() == host_log


def test_grpo_runs_without_the_critic_branch(kfp_run, kfp_layout, tmp_path):
    _, ac2_dir, _, _ = kfp_run
    cfg = tiny_config(algorithm="grpo", run__iterations=1)
    lines: list[str] = []
    # cold tasks, as on a cluster: each imports the stage code itself
    rows = local.run(cfg, str(tmp_path / "grpo"), log=lines.append, bootstrap_from=str(ac2_dir), task_host=False)
    assert not (tmp_path / "grpo" / "kfp" / "logs" / "taskhost.log").exists()
    assert f"bootstrap adopted from {ac2_dir}" in lines  # same model, task and seed: the AC2 run's bootstrap
    assert rows[-1]["iteration"] == 1 and rows[-1]["critic_error"] is None
    grpo = RunLayout(str(tmp_path / "grpo"))
    for name in BOOTSTRAP_OUTPUTS:
        assert storage.content_hash(grpo.bootstrap(name)) == storage.content_hash(kfp_layout.bootstrap(name)), name
    for stage, names in ITERATION_OUTPUTS.items():
        assert all(storage.exists(grpo.output(1, name)) for name in names) == (stage != "update_critic"), stage
    assert not (kfp_run_dir(tmp_path / "grpo", "iter-0001") / "update-critic").exists()


@pytest.mark.parametrize(
    "stage, inputs, output",
    [
        (
            "generate_chunks",
            {
                "problems": "bootstrap/problems",
                "prefixes": "iter-0002/sample_prefixes/prefixes",
                "actor": "iter-0001/update_actor/actor",
            },
            "iter-0002/generate_chunks/chunks",
        ),
        (
            "update_critic",
            {
                "problems": "bootstrap/problems",
                "replay": "iter-0002/sample_prefixes/replay",
                "critic": "iter-0001/update_critic/critic",
                "critic_pairs": "iter-0002/score_chunks/critic_pairs",
                "scored_chunks": "iter-0002/score_chunks/scored_chunks",
            },
            "iter-0002/update_critic/critic",
        ),
    ],
)
def test_stage_rerun_reproduces_the_pipeline_output(kfp_run, tmp_path, stage, inputs, output):
    cfg, out, _, _ = kfp_run
    argv = ["stage", stage, "--config", str(config_file(cfg, tmp_path)), "--iteration", "2"]
    for key, path in inputs.items():  # the run folder's names, as the README's example uses them
        argv += ["--in", f"{key}={out / path}"]
    name = output.rsplit("/", 1)[1]
    argv += ["--out", f"{name}={tmp_path / name}"]
    (tmp_path / name).mkdir()  # as a cluster's launcher may: the stage's atomic publish replaces it
    assert main(argv) == 0
    assert storage.content_hash(str(tmp_path / name)) == storage.content_hash(str(out / output))


def test_stage_command_names_bad_keys(kfp_run, tmp_path, capsys):
    cfg, _, _, _ = kfp_run
    assert main(["stage", "check_readiness", "--config", str(config_file(cfg, tmp_path)), "--in", "actor=x"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ac2: stage check_readiness: unknown key(s) actor; it takes --in readiness") and "\n" not in err
    assert main(["stage", "evaluate", "--config", str(config_file(cfg, tmp_path)), "--in", "actor=/nowhere"]) == 1
    assert "missing --in problems" in capsys.readouterr().err


def test_an_inprocess_run_adopts_a_kfp_run_folder_and_ac2_stage_reruns_its_stages(kfp_run, kfp_layout, tmp_path, capsys):
    cfg, out, _, _ = kfp_run
    config = str(config_file(cfg, tmp_path))
    # the inprocess runner starts from the kfp run's bootstrap and writes the same first iteration
    ip = tmp_path / "inprocess"
    argv = ["run", "--config", config, "--runner", "inprocess", "--iterations", "1", "--out", str(ip)]
    assert main([*argv, "--bootstrap-from", str(out)]) == 0
    assert f"bootstrap adopted from {out}" in capsys.readouterr().out
    for stage, names in ITERATION_OUTPUTS.items():
        for name in names:
            uri = f"{ip}/iter-0001/{stage}/{name}"
            assert storage.content_hash(uri) == storage.content_hash(kfp_layout.output(1, name)), uri
            # and the same lineage: both runners name the inputs by their place in the run folder
            assert storage.read_manifest(uri).lineage == storage.read_manifest(kfp_layout.output(1, name)).lineage, uri
    # the README's `ac2 stage` example, on the kfp run folder
    argv = ["stage", "check_readiness", "--config", config, "--iteration", "2"]
    argv += ["--in", f"readiness={out}/iter-0001/check_readiness/readiness"]
    argv += ["--in", f"critic_pairs={out}/iter-0002/score_chunks/critic_pairs"]
    argv += ["--in", f"scored_chunks={out}/iter-0002/score_chunks/scored_chunks"]
    argv += ["--out", f"readiness={tmp_path}/readiness", "--out", f"advantages={tmp_path}/advantages"]
    assert main(argv) == 0
    for name in ("readiness", "advantages"):
        assert storage.content_hash(f"{tmp_path}/{name}") == storage.content_hash(kfp_layout.output(2, name))
    assert main(["report", str(ip)]) == 0  # the report reads either runner's run folder
    assert (ip / "report.md").read_text().count("\n| 1 |") == 1


def test_both_runners_write_the_same_bootstrap(kfp_layout, tmp_path):
    layout = RunLayout(str(tmp_path / "inprocess"))
    inprocess.run_bootstrap(tiny_config(), layout, log=lambda _: None)
    for name in BOOTSTRAP_OUTPUTS:
        assert storage.content_hash(kfp_layout.bootstrap(name)) == storage.content_hash(layout.bootstrap(name)), name


def test_report_writes_curve_and_table(kfp_run):
    _, out, rows, _ = kfp_run
    assert main(["report", str(out)]) == 0
    assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "report.md").read_text()
    assert sum(line.startswith("| ") and line[2].isdigit() for line in table.splitlines()) == len(rows)


def test_a_run_folder_of_the_older_kfp_layout_is_moved_into_the_shared_one(kfp_run, kfp_layout, tmp_path):
    # before both runners shared one layout, kfp/runs.json named each artifact by its URI under
    # kfp.local's own folders (and an adopted bootstrap where its run had put it)
    cfg, _, _, _ = kfp_run
    old = tmp_path / "old"
    iterations = {}
    for it in (1, 2):
        iterations[str(it)] = {}
        for stage, names in ITERATION_OUTPUTS.items():
            for name in names:
                uri = old / "kfp" / f"ac2-iteration-{it}" / stage.replace("_", "-") / f"out_{name}"
                shutil.copytree(kfp_layout.output(it, name), uri)
                iterations[str(it)][name] = str(uri)
    bootstrap = {name: kfp_layout.bootstrap(name) for name in BOOTSTRAP_OUTPUTS}  # another run's
    body = {"algorithm": cfg.algorithm, "bootstrap": bootstrap, "iterations": iterations}
    (old / "kfp" / "runs.json").write_text(json.dumps(body))
    layout = RunLayout(str(old))
    record = local.KfpRuns.load(old / "kfp" / "runs.json", cfg, layout)
    assert record.runs == {"iter-0001": "ac2-iteration-1", "iter-0002": "ac2-iteration-2"}
    assert layout.has_bootstrap() and layout.completed_iterations() == 2
    assert storage.find_artifacts(str(old / "kfp")) == []  # moved out of kfp/
    assert all(storage.exists(uri) for uri in bootstrap.values())  # the other run's bootstrap stays where it was
    for it in (1, 2):
        for names in ITERATION_OUTPUTS.values():
            for name in names:
                assert storage.content_hash(layout.output(it, name)) == storage.content_hash(kfp_layout.output(it, name))
    assert "iterations" not in json.loads((old / "kfp" / "runs.json").read_text())


def test_a_failed_task_is_one_line_naming_the_artifact(kfp_run, tmp_path, capsys):
    cfg, out, _, _ = kfp_run
    # a run folder whose bootstrap problem set was altered after it was published
    shutil.copytree(out / "bootstrap", tmp_path / "run" / "bootstrap")
    bad = tmp_path / "run" / "bootstrap" / "problems"
    (bad / "data.parquet").write_bytes(b"not the published bytes")
    assert main(["run", "--config", str(config_file(cfg, tmp_path)), "--out", str(tmp_path / "run"), "--iterations", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ac2: iter-0001: ArtifactError: ") and "\n" not in err
    assert f"{bad}: data.parquet does not match its manifest" in err and "full log: " in err


def test_tasks_import_the_drivers_code_not_the_working_directorys(tmp_path, monkeypatch):
    # a decoy checkout in the working directory and on PYTHONPATH, as when `ac2 run` starts in another clone
    (tmp_path / "ac2_core").mkdir()
    (tmp_path / "ac2_core" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    probe = [sys.executable, "-c", "import ac2_core; print(ac2_core.__file__)"]  # cwd first on sys.path, as `-m`
    decoy = str(tmp_path / "ac2_core" / "__init__.py")
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip() == decoy
    with local._tasks_import_this_code():
        found = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
    assert found == ac2_core.__file__ != decoy
    assert os.environ["PYTHONPATH"] == str(tmp_path) and "PYTHONSAFEPATH" not in os.environ  # restored


def test_the_warm_starts_progress_in_a_task_log_reaches_the_console(tmp_path):
    console, seen = io.StringIO(), []
    with open(tmp_path / "bootstrap.log", "w") as log_file:
        sink = local._LogSink(log_file, lambda line: print(f"progress: {line}"), console)
        with contextlib.redirect_stdout(sink), indented_print():  # as kfp.local streams a task's output
            print("warm start: SFT on 3968 worked solutions, up to 1000 steps", end="\n")
            for part in ("    warm start step 50/1000", " loss 2.840\n"):  # a line in two writes
                sys.stdout.write(part)
            print('{"executor_input": "warm start step"}')
            print("    warm start (deeper: not a stage line)")
            print("critic reading: 500 steps on 3968 pairs of demonstrations")  # the bootstrap's next phase
            print("critic reading step 125/500 loss 1.204")
            seen = console.getvalue().splitlines()
    assert seen == [
        "progress: warm start: SFT on 3968 worked solutions, up to 1000 steps",
        "progress: warm start step 50/1000 loss 2.840",
        "progress: critic reading: 500 steps on 3968 pairs of demonstrations",
        "progress: critic reading step 125/500 loss 1.204",
    ]
    log = (tmp_path / "bootstrap.log").read_text()
    assert log.count("    warm start") == 3 and "progress:" not in log


def test_the_task_host_builds_each_model_once_for_all_the_tasks_that_read_it(kfp_run):
    # 2 iterations: the bootstrap's actor and critic, then each iteration's new ones (evaluate reads both first);
    # generate_chunks, score_chunks, update_actor and update_critic of the next iteration load nothing
    _, out, _, _ = kfp_run
    log = (out / "kfp" / "logs" / "taskhost.log").read_text().splitlines()
    loaded = [line.split()[2] for line in log if line.startswith("taskhost: loaded ")]
    assert loaded == ["actor", "critic"] * 3


def test_the_task_hosts_workers_import_next_to_nothing_for_themselves(kfp_run):
    # a module a worker imports is imported again by every task that needs it (pandas through
    # pyarrow's Table.from_pylist: 300 modules, 0.15 s of CPU a task; deepspeed through accelerate in
    # save_pretrained: 1500 modules, 0.8 s), where the inprocess runner imports it once a run
    _, out, _, _ = kfp_run
    log = (out / "kfp" / "logs" / "taskhost.log").read_text().splitlines()
    workers = [line for line in log if line.startswith("taskhost: worker ")]
    stages = {line.split("(")[1].split(")")[0] for line in workers}
    assert stages >= set(ITERATION_OUTPUTS) | {"bootstrap"}
    counts = [int(line.split("; imported ")[1].split()[0]) for line in workers]
    assert max(counts) <= 10, "\n".join(line for line, n in zip(workers, counts) if n > 10)
