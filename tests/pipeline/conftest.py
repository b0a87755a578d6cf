"""Pipeline-test fixtures: one 2-iteration AC2 run through kfp.local, shared by the tests that read it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ac2_core.runner.layout import RunLayout
from pipelines import local
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
def kfp_layout(kfp_run) -> RunLayout:
    """The kfp run's folder: its artifacts at their names (the inprocess runner's layout)."""
    _, out, _, _ = kfp_run
    return RunLayout(str(out))
