"""The kfp runner killed while it moves a finished pipeline run's outputs into the run folder:
its task host stops with it, and the rerun of the same command ends with the artifacts that
the inprocess runner writes from the same folder, and leaves no unfinished pipeline run."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ac2_core import storage
from ac2_core.runner import inprocess
from ac2_core.runner.layout import RunLayout
from pipelines import local
from tests.conftest import ROOT, tiny_config
from tests.faults.conftest import RUN_FILES, artifacts_of, local_files, stray_files
from tests.pipeline.conftest import config_file


@pytest.mark.slow
def test_a_kfp_run_killed_while_it_moves_outputs_resumes_to_the_inprocess_runners_artifacts(kfp_run, tmp_path):
    _, finished, _, _ = kfp_run
    cfg = tiny_config(run__iterations=3)
    out, twin = tmp_path / "kfp", tmp_path / "inprocess"
    shutil.copytree(finished, out)
    shutil.copytree(finished, twin)
    own_files = set(stray_files(str(out), local_files))  # what the finished run folder held besides artifacts
    argv = ["run", "--config", str(config_file(cfg, tmp_path)), "--out", str(out), "--iterations", "3"]
    killed = subprocess.run(
        [sys.executable, "-m", "tests.faults.targets", "move", "3", "--", *argv], cwd=ROOT, capture_output=True, timeout=600
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    # iteration 3 ran, two of its outputs were moved, and the third move never happened
    assert storage.exists(str(out / "iter-0003" / "sample_prefixes" / "prefixes"))
    assert not storage.exists(str(out / "iter-0003" / "evaluate" / "metrics"))
    host_log = out / "kfp" / "logs" / "taskhost.log"
    deadline = time.monotonic() + 60
    while "the process that started it is gone" not in host_log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "the process that started it is gone; stopping" in host_log.read_text()
    attempt = json.loads((out / "kfp" / "runs.json").read_text())["runs"]["iter-0003"]

    resumed = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming {out} after iteration 2" in resumed.stdout

    inprocess.run(cfg, str(twin), log=lambda _: None)
    assert artifacts_of(str(out)) == artifacts_of(str(twin))  # every artifact, bit for bit (iteration 1's checkpoints pruned)
    runs = json.loads((out / "kfp" / "runs.json").read_text())["runs"]
    assert runs["iter-0003"] != attempt and not (out / "kfp" / attempt).exists()  # the unfinished attempt is gone
    assert sorted(p.name for p in (out / "kfp").iterdir() if p.is_dir()) == sorted([*runs.values(), "logs"])
    assert storage.find_artifacts(str(out / "kfp")) == []
    new_files = {f for f in stray_files(str(out), local_files, RUN_FILES) if not f.startswith("kfp/")} - own_files
    assert new_files == set()  # no staging, no renamed-aside copy, no lock (new TensorBoard event files are the run's own)


def test_pipeline_runs_that_runs_json_does_not_name_are_removed_when_a_run_starts(tmp_path):
    cfg = tiny_config()
    root = tmp_path / "run" / "kfp"
    for folder in ("bootstrap-pipeline-20990101000000", "iteration-pipeline-20990101000100", "logs"):
        (root / folder).mkdir(parents=True)
    table = storage.table_from_rows([], "replay")
    storage.write_table(str(root / "iteration-pipeline-20990101000100" / "sample-prefixes" / "out_replay"), table,
                        kind="replay", stage="sample_prefixes", config_hash="h")  # fmt: skip
    (root / "runs.json").write_text(json.dumps({"algorithm": "ac2", "runs": {"bootstrap": "bootstrap-pipeline-20990101000000"}}))
    said = []
    local.KfpLocal(cfg, root, RunLayout(str(tmp_path / "run")), said.append)
    assert sorted(p.name for p in root.iterdir()) == ["bootstrap-pipeline-20990101000000", "logs", "runs.json"]
    assert said == [f"removed {root / 'iteration-pipeline-20990101000100'}: a pipeline run that did not finish"]
