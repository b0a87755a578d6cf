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
from ac2_core.models.store import ModelStore
from ac2_core.runner import inprocess
from ac2_core.runner.layout import OUTPUTS, RunLayout
from pipelines import local
from pipelines.cli import main
from pipelines.driver import RunState
from tests.conftest import tiny_config
from tests.pipeline.conftest import config_file

BOOTSTRAP_OUTPUTS = {"problems", "actor", "critic", "replay", "scored_chunks", "readiness", "metrics"}
ITERATION_OUTPUTS = {name for outs in OUTPUTS.values() for name in outs}


def test_ac2_runs_two_chained_iterations(kfp_run, kfp_state):
    cfg, out, rows, lines = kfp_run
    assert [r["iteration"] for r in rows if r["iteration"] > 0] == [1, 2]
    assert set(kfp_state.bootstrap) == BOOTSTRAP_OUTPUTS
    assert set(kfp_state.iterations) == {1, 2}
    assert all(set(kfp_state.iterations[it]) == ITERATION_OUTPUTS for it in (1, 2))
    assert rows == storage.read_rows(kfp_state.iterations[2]["metrics"], kind="metrics")
    # each iteration's progress line is the inprocess runner's row format
    assert lines.count(inprocess.HEADER) == 1
    assert sum(line.startswith(inprocess.format_row(r)) for line in lines for r in rows if r["iteration"] > 0) == 2
    # iteration 2 imported exactly what iteration 1 published (lineage through dsl.importer)
    run_dir = Path(kfp_state.iterations[2]["actor"]).parents[1]
    consumed = json.loads((run_dir / "update-actor" / "executor_output.json").read_text())
    assert consumed["artifacts"]["out_actor"]["artifacts"][0]["metadata"]["policy_version"] == 2
    assert storage.read_manifest(kfp_state.iterations[2]["actor"]).stage == "update_actor"
    # outputs carry their manifest and the stage's figures in their KFP metadata
    meta = json.loads((run_dir / "score-chunks" / "executor_output.json").read_text())["artifacts"]["out_scored_chunks"][
        "artifacts"
    ][0]["metadata"]
    assert meta["content_hash"] == storage.content_hash(kfp_state.iterations[2]["scored_chunks"])
    assert meta["rows"] == meta["chunks"] > 0
    report = (run_dir / "evaluate" / "report").read_text()
    assert report.splitlines()[-1].startswith("validation score:")
    figures = json.loads((run_dir / "evaluate" / "executor_output.json").read_text())["artifacts"]["figures"]["artifacts"][0][
        "metadata"
    ]
    assert figures["iteration"] == 2 and "cum_decode_flops" in figures
    # every stage ran in a worker of the warm task host (the default); none fell back to a cold start
    assert "imports done" in (out / "kfp" / "logs" / "taskhost.log").read_text()
    assert not any("in the task's own process" in f.read_text() for f in (out / "kfp" / "logs").glob("iter-*.log"))


def test_finished_run_is_resumed_not_repeated(kfp_run, kfp_state):
    cfg, out, rows, _ = kfp_run
    before = sorted(p.name for p in (out / "kfp").iterdir())
    lines: list[str] = []
    assert local.run(cfg, str(out), log=lines.append) == rows
    assert sorted(p.name for p in (out / "kfp").iterdir()) == before
    assert any(line.startswith(f"resuming {out} after iteration 2") for line in lines)


def test_grpo_runs_without_the_critic_branch(kfp_run, kfp_state, tmp_path):
    _, ac2_dir, _, _ = kfp_run
    cfg = tiny_config(algorithm="grpo", run__iterations=1)
    lines: list[str] = []
    # cold tasks, as on a cluster: each imports the stage code itself
    rows = local.run(cfg, str(tmp_path / "grpo"), log=lines.append, bootstrap_from=str(ac2_dir), task_host=False)
    assert not (tmp_path / "grpo" / "kfp" / "logs" / "taskhost.log").exists()
    assert f"bootstrap adopted from {ac2_dir}" in lines  # same model, task and seed: the AC2 run's bootstrap
    assert rows[-1]["iteration"] == 1 and rows[-1]["critic_error"] is None
    state = RunState.load(tmp_path / "grpo" / "kfp" / "runs.json")
    assert state.bootstrap == kfp_state.bootstrap
    assert set(state.iterations[1]) == ITERATION_OUTPUTS - {"critic"}
    run_dir = Path(state.iterations[1]["actor"]).parents[1]
    assert not (run_dir / "update-critic").exists()


@pytest.mark.parametrize(
    "stage, inputs, output",
    [
        ("generate_chunks", {"problems": "b:problems", "prefixes": "2:prefixes", "actor": "1:actor"}, "chunks"),
        (
            "update_critic",
            {
                "problems": "b:problems",
                "replay": "2:replay",
                "critic": "1:critic",
                "critic_pairs": "2:critic_pairs",
                "scored_chunks": "2:scored_chunks",
            },
            "critic",
        ),
    ],
)
def test_stage_rerun_reproduces_the_pipeline_output(kfp_run, kfp_state, tmp_path, stage, inputs, output):
    cfg, _, _, _ = kfp_run
    uri = lambda ref: (kfp_state.bootstrap if ref[0] == "b" else kfp_state.iterations[int(ref[0])])[ref[2:]]  # noqa: E731
    argv = ["stage", stage, "--config", str(config_file(cfg, tmp_path)), "--iteration", "2"]
    for key, ref in inputs.items():
        argv += ["--in", f"{key}={uri(ref)}"]
    argv += ["--out", f"{output}={tmp_path / output}"]
    (tmp_path / output).mkdir()  # as a cluster's launcher may: the stage's atomic publish replaces it
    assert main(argv) == 0
    assert storage.content_hash(str(tmp_path / output)) == storage.content_hash(kfp_state.iterations[2][output])


def test_stage_command_names_bad_keys(kfp_run, tmp_path, capsys):
    cfg, _, _, _ = kfp_run
    assert main(["stage", "check_readiness", "--config", str(config_file(cfg, tmp_path)), "--in", "actor=x"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ac2: stage check_readiness: unknown key(s) actor; it takes --in readiness") and "\n" not in err
    assert main(["stage", "evaluate", "--config", str(config_file(cfg, tmp_path)), "--in", "actor=/nowhere"]) == 1
    assert "missing --in problems" in capsys.readouterr().err


def test_kfp_and_inprocess_runners_write_identical_artifacts(kfp_run, kfp_state, tmp_path):
    cfg, _, _, _ = kfp_run
    layout = RunLayout(str(tmp_path / "inprocess"))
    inprocess.run_bootstrap(cfg, layout, log=lambda _: None)
    inprocess.run_iteration(cfg, layout, 1, ModelStore(cfg, keep_in_memory=True))
    for name, uri in kfp_state.bootstrap.items():
        assert storage.content_hash(uri) == storage.content_hash(layout.bootstrap(name)), f"bootstrap {name}"
    for name, uri in kfp_state.iterations[1].items():
        assert storage.content_hash(uri) == storage.content_hash(layout.output(1, name)), f"iteration 1 {name}"
    assert main(["report", layout.root]) == 0  # the report reads either runner's run folder
    assert (Path(layout.root) / "report.md").read_text().count("\n| 1 |") == 1


def test_report_writes_curve_and_table(kfp_run):
    _, out, rows, _ = kfp_run
    assert main(["report", str(out)]) == 0
    assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "report.md").read_text()
    assert sum(line.startswith("| ") and line[2].isdigit() for line in table.splitlines()) == len(rows)


def test_a_failed_task_is_one_line_naming_the_artifact(kfp_run, kfp_state, tmp_path, capsys):
    cfg, _, _, _ = kfp_run
    # a run folder whose bootstrap problem set was altered after it was published
    bad = tmp_path / "problems"
    shutil.copytree(kfp_state.bootstrap["problems"], bad)
    (bad / "data.parquet").write_bytes(b"not the published bytes")
    state = RunState(tmp_path / "run" / "kfp" / "runs.json", cfg.algorithm, {**kfp_state.bootstrap, "problems": str(bad)})
    state.save()
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
            seen = console.getvalue().splitlines()
    assert seen == [
        "progress: warm start: SFT on 3968 worked solutions, up to 1000 steps",
        "progress: warm start step 50/1000 loss 2.840",
    ]
    log = (tmp_path / "bootstrap.log").read_text()
    assert log.count("    warm start") == 3 and "progress:" not in log
