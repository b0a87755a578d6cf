"""Fault-injection fixtures: a warm process to fork runs from, and a run folder read back whole.

``zygote`` is a warm task host (``pipelines.taskhost``) started for this package: each
call is a fresh forked process that already has torch and the stage code imported, so a
run that is killed and resumed twenty times pays the imports once. A worker killed with
SIGKILL is reaped by the host, and the call raises ``Killed``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, settings

from ac2_core import storage
from components import taskhost as task_side
from pipelines import local, taskhost
from tests.faults import targets
from tests.storage.conftest import clean_aws_env, seaweed  # noqa: F401  (the S3 kill tests' SeaweedFS on loopback)

# Generated cases are the same in every run (derandomize): CI stays reproducible, and a failure
# names its example. No example database is kept in the repository.
settings.register_profile(
    "ac2", deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.load_profile("ac2")


class Killed(Exception):
    """The forked run died before it replied (the SIGKILL the test asked for)."""


@dataclass(frozen=True)
class Zygote:
    address: str

    def ac2(self, argv: list[str], **kwargs) -> int:
        """``ac2 <argv>`` in a fresh process forked from the warm host; its exit code, or Killed."""
        try:
            return task_side.call(targets.ac2, {"argv": argv, **kwargs}, address=self.address)
        except RuntimeError as e:
            if "died before it replied" in str(e):
                raise Killed(str(e)) from None
            raise


@pytest.fixture(scope="package")
def zygote(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zygote")
    with local.warm_task_host(folder / "taskhost.log") as address:
        os.environ.pop(task_side.ENV, None)  # only these tests call it; kfp.local tasks elsewhere must not
        taskhost.wait_ready(address)
        yield Zygote(address)


def config_yaml(cfg, folder: Path) -> str:
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return str(path)


def artifacts_of(root: str) -> dict[str, str]:
    """Every published artifact under ``root``: its path relative to ``root`` -> its manifest as
    written; each of its files verified against the manifest (a sha256 per file: bit for bit)."""
    found = {}
    for uri in storage.find_artifacts(root):
        manifest = storage.read_manifest(uri)
        for name in manifest.files:
            storage.read_file(uri, name)  # raises where a file does not match
        found[uri.removeprefix(root.rstrip("/") + "/")] = manifest.to_json()
    return found


# a run folder's own files besides its artifacts: the summary, the recorded config, the timings,
# TensorBoard's event files (a name ending in / allows what is under that folder)
RUN_FILES = ("summary.md", "config.yaml", "timings.json", "tensorboard/")


def stray_files(root: str, list_files: Callable[[str], list[str]], allowed: tuple[str, ...] = ()) -> list[str]:
    """Files under ``root`` that belong to no published artifact and are not ``allowed``
    (``list_files`` gives paths relative to root)."""
    artifacts = {uri.removeprefix(root.rstrip("/") + "/") for uri in storage.find_artifacts(root)}
    listed = set()
    for a in artifacts:
        listed |= {f"{a}/{n}" for n in storage.read_manifest(storage.join(root, a)).files} | {f"{a}/{storage.MANIFEST}"}
    folders = tuple(a for a in allowed if a.endswith("/"))
    return sorted(f for f in list_files(root) if f not in listed and f not in allowed and not f.startswith(folders))


def local_files(root: str) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in Path(root).rglob("*") if p.is_file())


@pytest.fixture(scope="package")
def finished_run(tmp_path_factory):
    """(config, run folder) of a finished 1-iteration inprocess run, to copy and damage (never modify it)."""
    from ac2_core.runner import inprocess
    from tests.conftest import tiny_config

    cfg = tiny_config(run__iterations=1)
    out = tmp_path_factory.mktemp("finished") / "run"
    inprocess.run(cfg, str(out), log=lambda _: None)
    return cfg, out
