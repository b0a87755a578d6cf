"""Shared fixtures: a tiny config and a bootstrapped run folder, built once per session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ac2_core.config import load_config
from ac2_core.runner.inprocess import run_bootstrap
from ac2_core.runner.layout import RunLayout

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "pipelines" / "configs" / "toy.yaml"

# Small enough for seconds per iteration, permissive enough that chunk mode happens in
# iteration 2: every problem with 2 pairs is ready, and every problem is revisited.
TINY = {
    "model.tiny": {
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 2,
        "num_kv_heads": 1,
        "head_dim": 32,
        "intermediate_size": 128,
    },
    "task.train_size": 64,
    "task.val_size": 8,
    "task.n_terms": 3,
    "warm_start.max_steps": 0,
    "rollout.problems_per_iteration": 4,
    "rollout.group_size": 4,
    "rollout.chunk_tokens": 8,
    "rollout.max_response_tokens": 32,
    "rollout.revisit_fraction": 1.0,
    "rollout.probe_fraction": 0.0,
    "readiness.min_pairs": 2,
    "readiness.max_error": 1.0,
    "readiness.require_mixed_outcomes": False,
    "readiness.metric": "binned_calibration",  # an untrained critic never discriminates: keep chunk mode reachable
    "warm_start.slip_rate": 0.0,
    "critic.read_steps": 0,
    "critic.train_backbone": True,  # the tests' critic trains its backbone, so data-parallel and backend checks see it move
    "rollout.prefixes_per_problem": 2,
    "critic.warmup_iterations": 0,
    "critic.max_input_tokens": 96,
    "eval.every": 1,
    "eval.samples_per_problem": 1,
    "run.iterations": 2,
    "actor.lr": 1e-4,  # the tests' tiny runs keep the step they were written with (the toy's is 3e-5)
}


def tiny_config(**overrides):
    return load_config(TOY, {**TINY, **{k.replace("__", "."): v for k, v in overrides.items()}})


@pytest.fixture(scope="session")
def tiny_cfg():
    return tiny_config()


@pytest.fixture(scope="session")
def _bootstrap_dir(tmp_path_factory, tiny_cfg):
    root = tmp_path_factory.mktemp("bootstrap")
    run_bootstrap(tiny_cfg, RunLayout(str(root)), log=lambda _: None)
    return root / "bootstrap"


@pytest.fixture
def run_dir(tmp_path, _bootstrap_dir) -> Path:
    """A fresh run folder whose bootstrap (problems, actor, critic) is already written."""
    shutil.copytree(_bootstrap_dir, tmp_path / "run" / "bootstrap")
    return tmp_path / "run"
