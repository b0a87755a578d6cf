"""The device plumbing of the stages, run on the CPU: CI covers the path the GPU check takes.

``tests/gpu/iteration.py`` (the GPU check) runs here with ``model.device: cpu`` and the
tiny model: bootstrap, one iteration through every stage, the report. And cuda asked
for where there is none fails before anything is written.
"""

from __future__ import annotations

import math

import pytest
import torch

from ac2_core.config import ConfigError
from ac2_core.models.store import ModelStore
from ac2_core.runner import inprocess
from ac2_core.runner.layout import RunLayout
from tests.conftest import TINY, tiny_config
from tests.gpu.iteration import measure, report, write_report

CPU_RUN = {
    **TINY,
    "model.device": "cpu",
    "run.iterations": 1,
    # as in the GPU check: every chunk of the untrained actor gets A = -0.5
    "advantage.baseline": "critic",
    "advantage.full_groups": "chunk",
}


def test_the_gpu_check_runs_one_iteration_on_an_explicit_cpu_device(tmp_path, monkeypatch):
    rows = measure(CPU_RUN, tmp_path / "work", ["torch"])
    (row,) = rows
    assert row["devices"] == {"actor": "cpu", "critic": "cpu", "critic head": "cpu"}
    assert row["dtypes"] == {"actor": "torch.float32", "critic head": "torch.float32"}
    assert row["decode_tokens"] == row["metrics"]["generate_chunks"]["decode_tokens"] > 0
    assert row["tokens_per_second"] > 0
    actor, critic = row["metrics"]["update_actor"], row["metrics"]["update_critic"]
    assert actor["trained_chunks"] > 0 and actor["grad_norm"] > 0  # the actor really stepped
    assert critic["examples"] > 0 and math.isfinite(critic["loss_last"])
    assert all(row["seconds"][s] > 0 for s in ("generate_chunks", "update_actor", "update_critic"))

    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    text = report(rows, title="cpu")
    written = write_report(text)
    assert written == tmp_path / "out" / "gpu_iteration.md" and written.read_text() == text
    line = next(x for x in text.splitlines() if x.startswith("| torch |"))
    assert f"| {row['decode_tokens']} |" in line and f"{row['seconds']['update_actor']:.2f}" in line


def test_cuda_where_there_is_none_fails_before_anything_is_written(tmp_path, monkeypatch, run_dir):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = tiny_config(model__device="cuda")
    with pytest.raises(ConfigError, match=r"model\.device is 'cuda'"):
        inprocess.run(cfg, str(tmp_path / "fresh"), log=lambda _: None)
    assert not (tmp_path / "fresh").exists()
    # a single stage (a KFP task) fails the same way, when it first loads a model
    with pytest.raises(ConfigError, match=r"model\.device is 'cuda'"):
        ModelStore(cfg).load(RunLayout(str(run_dir)).bootstrap("actor"), kind="actor")
