"""Pipeline-test fixtures: one 2-iteration AC2 run through kfp.local, shared by the tests that read it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines import local
from pipelines.driver import RunState
from tests.conftest import tiny_config


def config_file(cfg, folder: Path) -> Path:
    """The config as a YAML file, for the ``ac2`` commands that read one."""
    path = folder / f"{cfg.algorithm}.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return path


@pytest.fixture(scope="session")
def kfp_run(tmp_path_factory):
    """A finished 2-iteration AC2 run through kfp.local: (config, run folder, metrics rows, log lines)."""
    cfg = tiny_config()
    out = tmp_path_factory.mktemp("kfp-ac2") / "run"
    lines: list[str] = []
    rows = local.run(cfg, str(out), log=lines.append)
    return cfg, out, rows, lines


@pytest.fixture(scope="session")
def kfp_state(kfp_run) -> RunState:
    _, out, _, _ = kfp_run
    return RunState.load(out / "kfp" / "runs.json")
