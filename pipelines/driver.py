"""Chaining iteration runs: what run k gets from run k-1, and where a finished run's outputs are.

Shared by the local runner (``pipelines.local``) and the cluster submitter
(``pipelines.submit``). Every ac2 artifact is a directory with a ``manifest.json``, so a
finished run's outputs are found under its run root by their output names:

    kfp.local:  <pipeline_root>/<pipeline name>-<timestamp>/<task>/<output name>
    cluster:    <pipeline_root>/<pipeline name>/<run id>/<task>/<salt>/<output name>
                (KFP before 2.4 has no <salt> level)

Output names are the stage's keyword names (``out_actor``, ...) or, for the bootstrap,
the artifact names (``actor``, ...); both are stored here without the ``out_`` prefix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ac2_core import storage
from ac2_core.config import AC2Config

# What an iteration imports from the one before it (or from the bootstrap) as the pipeline
# parameter ``<name>_uri``; ``problems_uri`` and ``reference_uri`` always name the bootstrap's.
CHAINED = ("actor", "critic", "replay", "scored_chunks", "readiness", "metrics")


class PipelineFailed(RuntimeError):
    """A pipeline run that did not finish, or whose outputs cannot be found; one line for people."""


def find_outputs(run_root: str) -> dict[str, str]:
    """URI of every published ac2 artifact under a finished run's root, by output name."""
    found: dict[str, str] = {}
    for path in storage.find_artifacts(run_root):
        name = path.rstrip("/").rsplit("/", 1)[-1].removeprefix("out_")
        if name.startswith("."):  # a stage's staging or replaced copy, never an output
            continue
        if name in found:
            raise PipelineFailed(f"{run_root}: two outputs named {name} ({found[name]} and {path})")
        found[name] = path
    if not found:
        raise PipelineFailed(f"{run_root}: no published artifacts under this run root")
    return found


def iteration_arguments(cfg: AC2Config, bootstrap: dict[str, str], previous: dict[str, str] | None, iteration: int) -> dict:
    """Pipeline arguments of iteration ``iteration``: the config and the URIs it imports.

    ``previous`` is iteration - 1's outputs (None for the first); whatever it lacks comes
    from the bootstrap: under grpo that is the critic, which no grpo stage reads.
    """
    latest = {**bootstrap, **(previous or {})}
    missing = [name for name in CHAINED if name not in latest]
    if missing:
        raise PipelineFailed(f"iteration {iteration}: no {', '.join(missing)} from the previous run")
    return {
        "config_json": cfg.to_json(),
        "iteration": iteration,
        "problems_uri": bootstrap["problems"],
        "reference_uri": bootstrap["actor"],
        **{f"{name}_uri": latest[name] for name in CHAINED},
    }


BOOTSTRAP_OUTPUTS = ("problems", "actor", "critic", "replay", "scored_chunks", "readiness", "metrics")


def adopted_bootstrap(cfg: AC2Config, run_dir: str) -> dict[str, str]:
    """The bootstrap of another run folder (either runner's), if it was made for ``cfg``.

    Its artifacts are imported where they are, so both runs' lineage meets at one bootstrap.
    """
    runs = Path(run_dir, "kfp", "runs.json")
    if runs.exists():
        found = RunState.load(runs).bootstrap or {}
    else:
        from ac2_core.runner.layout import RunLayout

        found = {name: RunLayout(run_dir).bootstrap(name) for name in BOOTSTRAP_OUTPUTS}
    for name in BOOTSTRAP_OUTPUTS:
        if name not in found or not storage.exists(found[name]):
            raise ValueError(f"{run_dir}: no finished bootstrap to adopt (missing {name})")
        if storage.read_manifest(found[name]).config_hash != cfg.bootstrap_hash():
            raise ValueError(
                f"{found[name]} was bootstrapped with other model/task/warm_start/eval/seed settings; it cannot start this run"
            )
    return {name: found[name] for name in BOOTSTRAP_OUTPUTS}


@dataclass
class RunState:
    """What a chained run has finished so far, saved after every pipeline run (for resuming)."""

    path: Path
    algorithm: str
    bootstrap: dict[str, str] | None = None
    iterations: dict[int, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, cfg: AC2Config | None = None) -> RunState:
        """The saved state (or a fresh one for ``cfg``); refuses a run folder of the other algorithm."""
        if not path.exists():
            if cfg is None:
                raise ValueError(f"{path}: no such run state")
            return cls(path, cfg.algorithm)
        body = json.loads(path.read_text())
        if cfg is not None and body["algorithm"] != cfg.algorithm:
            raise ValueError(f"{path}: this run folder holds a {body['algorithm']} run; the config says {cfg.algorithm}")
        state = cls(path, body["algorithm"], body["bootstrap"], {int(k): v for k, v in body["iterations"].items()})
        state._drop_missing()
        return state

    def _drop_missing(self) -> None:
        # a run folder whose later artifacts were deleted resumes after the last whole iteration
        if self.bootstrap and not all(storage.exists(uri) for uri in self.bootstrap.values()):
            self.bootstrap, self.iterations = None, {}
        for it in sorted(self.iterations):
            if not storage.exists(self.iterations[it]["metrics"]):
                self.iterations = {k: v for k, v in self.iterations.items() if k < it}
                break

    @property
    def done(self) -> int:
        it = 0
        while it + 1 in self.iterations:
            it += 1
        return it

    def metrics_uri(self) -> str:
        if not self.done:
            raise ValueError(f"{self.path}: no finished iteration")
        return self.iterations[self.done]["metrics"]

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {"algorithm": self.algorithm, "bootstrap": self.bootstrap, "iterations": self.iterations}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
        tmp.replace(self.path)
