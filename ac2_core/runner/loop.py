"""The iteration loop of a local run, the same for both runners.

``run`` checks what the run reads (the config's device, the task's data, a bootstrap to
adopt) before anything is written, locks the run folder (``lock``), removes what a killed
run left there (``storage.remove_leftovers``), makes (or adopts) the bootstrap, resumes
after the last finished iteration, runs the rest one by one, prints a row for each and
drops old checkpoints. What a runner adds is how one pipeline of stages is executed
(``Runner``, opened by the loop once the folder is locked): ``ac2_core.runner.inprocess``
calls the stage functions in this process; ``pipelines.local`` runs the KFP pipelines
through kfp.local. Either way the artifacts land at their names in ``RunLayout``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from ac2_core import storage
from ac2_core.config import AC2Config
from ac2_core.runner import lock
from ac2_core.runner.layout import RunLayout
from ac2_core.runner.report import HEADER, format_row
from ac2_core.stages.recipe import BOOTSTRAP_STAGE

Log = Callable[[str], None]


class Runner(Protocol):
    label: str  # shown in the run's header line

    def bootstrap(self, cfg: AC2Config, layout: RunLayout, log: Log) -> None:
        """Write every bootstrap artifact at its ``layout.bootstrap`` URI."""

    def iteration(self, cfg: AC2Config, layout: RunLayout, iteration: int) -> None:
        """Write every artifact of ``iteration`` at its ``layout.output`` URI, ``metrics`` last."""


def run(
    cfg: AC2Config,
    out_dir: str,
    open_runner: Callable[[], AbstractContextManager[Runner]],
    *,
    log: Log = print,
    bootstrap_from: str | None = None,
) -> list[dict]:
    """Bootstrap (once, or adopt ``bootstrap_from``'s), then iterations up to ``cfg.run.iterations``;
    returns the metrics rows. A run folder that holds finished iterations is resumed after the last.

    ``open_runner()`` is entered once the inputs are checked and the folder is locked: a
    runner may write under ``out_dir`` (logs, a task host's) from then on, not before.
    """
    layout = RunLayout(out_dir)
    check_inputs(cfg, layout, bootstrap_from)  # before anything is written under out_dir
    with lock.held(out_dir, log=log):
        for removed in storage.remove_leftovers(out_dir):
            log(f"removed {removed}: left by a run that was killed while it wrote an artifact")
        with open_runner() as runner:
            return _iterations(cfg, layout, runner, log, bootstrap_from)


def check_inputs(cfg: AC2Config, layout: RunLayout, bootstrap_from: str | None) -> None:
    """What the bootstrap will read, checked now: a run that cannot start writes nothing.

    A cuda device that is absent (ConfigError naming model.device), a pretrained model
    that is not there, the task's data files, every row (DataError naming file, row and
    column), or a bootstrap to adopt that is missing or made for other settings.
    """
    if layout.has_bootstrap():
        return  # resumed: the bootstrap's artifacts hold the problems and models
    if bootstrap_from:
        adoptable(cfg, bootstrap_from)
        return
    if cfg.model.device == "cuda":
        from ac2_core.models.device import resolve_device

        resolve_device(cfg.model.device)
    path = cfg.model.path
    if cfg.model.source == "pretrained" and not (storage.exists(path) or Path(path).is_dir()):
        raise ValueError(f"model.path {path}: no published model and no local directory there")
    if cfg.task.data is not None:
        from ac2_core.tasks import problems_for

        problems_for(cfg.task)  # reads every row of data and val_data; the bootstrap reads them again


def _iterations(cfg: AC2Config, layout: RunLayout, runner: Runner, log: Log, bootstrap_from: str | None) -> list[dict]:
    out_dir = layout.root
    t_start = time.perf_counter()
    if not layout.has_bootstrap():
        t0 = time.perf_counter()
        if bootstrap_from:
            adopt_bootstrap(cfg, layout, bootstrap_from)
            log(f"bootstrap adopted from {bootstrap_from}")
        else:
            runner.bootstrap(cfg, layout, log)
            log(f"bootstrap: {time.perf_counter() - t0:.1f}s")
    done = layout.completed_iterations()
    if done:
        log(f"resuming {out_dir} after iteration {done}")
        prune(cfg, layout, done)  # in case the run that finished it was killed while it pruned
    log(f"{cfg.algorithm} training ({runner.label}): iterations {done + 1}..{cfg.run.iterations}")
    log(HEADER)
    if done == 0:
        log(format_row(storage.read_rows(layout.bootstrap("metrics"), kind="metrics")[0]) + "   (initial policy)")
    for it in range(done + 1, cfg.run.iterations + 1):
        t0 = time.perf_counter()
        runner.iteration(cfg, layout, it)
        metrics = storage.read_rows(layout.output(it, "metrics"), kind="metrics")[-1]
        log(f"{format_row(metrics)}   {time.perf_counter() - t0:5.1f}s")
        prune(cfg, layout, it)
    rows = storage.read_rows(layout.output(cfg.run.iterations, "metrics"), kind="metrics")
    log(f"done in {time.perf_counter() - t_start:.0f}s: {out_dir}")
    return rows


def prune(cfg: AC2Config, layout: RunLayout, it: int) -> None:
    """Drop checkpoints older than the newest ``run.keep_models`` iterations (tables are kept)."""
    old = it - cfg.run.keep_models
    if old >= 1:
        for name in ("actor", "critic"):
            storage.remove(layout.output(old, name))


def adopt_bootstrap(cfg: AC2Config, layout: RunLayout, source_root: str) -> None:
    """Start a run from another run folder's bootstrap (same model, task, warm start, eval and seed).

    Sharing one bootstrap is how AC2 and GRPO runs start from the same warm-started
    weights, and it saves the warm start. The artifacts are copied, manifests unchanged;
    a bootstrap made for other settings is refused before anything is copied.
    """
    source = adoptable(cfg, source_root)
    for name in BOOTSTRAP_STAGE.outputs:  # metrics last: the bootstrap counts as made once it is there
        storage.copy(source.bootstrap(name), layout.bootstrap(name))


def adoptable(cfg: AC2Config, source_root: str) -> RunLayout:
    """``source_root``'s layout, if it holds a finished bootstrap made for ``cfg``'s settings; else ValueError."""
    source = RunLayout(source_root)
    for name in BOOTSTRAP_STAGE.outputs:
        uri = source.bootstrap(name)
        if not storage.exists(uri):
            raise ValueError(f"{source_root}: no finished bootstrap to adopt (missing {uri})")
        if storage.read_manifest(uri).config_hash != cfg.bootstrap_hash():
            raise ValueError(
                f"{uri} was bootstrapped with other model/task/warm_start/eval/seed settings; it cannot start this run"
            )
    return source
