"""The iteration loop of a local run, the same for both runners.

``run`` checks the run folder against the config (``record``) and what the run reads (the
config's device, the task's data, a bootstrap to adopt) before anything is written, locks
the run folder (``lock``), checks the folder again under the lock and records the config,
removes what a killed run left there (``storage.remove_leftovers``), makes (or adopts) the
bootstrap, resumes after the last finished iteration, runs the rest one by one, shows a row
for each with progress and ETA, hands it to the trackers and drops old checkpoints. What a
runner adds is how one pipeline of stages is executed (``Runner``, opened by the loop once
the folder is locked): ``ac2_core.runner.inprocess``
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
from ac2_core.runner import lock, record
from ac2_core.runner.layout import RunLayout
from ac2_core.runner.progress import Progress, bootstrap_log
from ac2_core.runner.report import HEADER, format_row, metrics_markdown
from ac2_core.runner.timings import add_timing, read_timings
from ac2_core.runner.tracking import TENSORBOARD, Trackers
from ac2_core.stages.recipe import BOOTSTRAP_STAGE

Log = Callable[[str], None]


class Runner(Protocol):
    label: str  # shown in the run's header line

    def bootstrap(self, cfg: AC2Config, layout: RunLayout, log: Log) -> None:
        """Write every bootstrap artifact at its ``layout.bootstrap`` URI."""

    def iteration(self, cfg: AC2Config, layout: RunLayout, iteration: int) -> dict[str, float]:
        """Write every artifact of ``iteration`` at its ``layout.output`` URI, ``metrics`` last;
        return each stage's wall seconds (those it knows)."""


SUMMARY = "summary.md"


def run(
    cfg: AC2Config,
    out_dir: str,
    open_runner: Callable[[], AbstractContextManager[Runner]],
    *,
    log: Log = print,
    bootstrap_from: str | None = None,
    resume: str = "auto",
    tty: bool | None = None,
) -> list[dict]:
    """Bootstrap (once, or adopt ``bootstrap_from``'s), then iterations up to ``cfg.run.iterations``;
    returns the metrics rows.

    A run folder that holds a run is checked against ``cfg`` first (``record.check``: another
    config stops here, ``resume="never"`` refuses it) and resumed after its last finished
    iteration; asked for fewer iterations than it holds, it is left unchanged. Progress (with
    elapsed time and ETA) goes to ``log``, as a bar on a terminal (``tty``: None to detect);
    every row also goes to the trackers (``tracking``) and ``summary.md``.

    ``open_runner()`` is entered once the inputs are checked, the folder is locked and its
    config recorded: a runner may write under ``out_dir`` (logs, a task host's) from then on, not before.
    """
    layout = RunLayout(out_dir)
    state = record.check(cfg, layout, resume=resume)  # writes nothing: another run's folder is refused untouched
    if state.fewer(cfg):
        return _nothing_to_run(cfg, layout, state, log)
    check_inputs(cfg, layout, bootstrap_from)  # before anything is written under out_dir
    with lock.held(out_dir, log=log):
        state = record.check(cfg, layout, resume=resume)  # again, now that no other run can record in between
        if state.fewer(cfg):
            return _nothing_to_run(cfg, layout, state, log)
        for removed in storage.remove_leftovers(out_dir, plain=(TENSORBOARD,)):
            log(f"removed {removed}: left by a run that was killed while it wrote an artifact")
        record.record(cfg, layout)
        trackers = Trackers(cfg, out_dir)
        try:
            with open_runner() as runner:
                _run(cfg, layout, runner, log, bootstrap_from, trackers, tty)
        finally:
            trackers.close()
        rows = storage.read_rows(layout.output(cfg.run.iterations, "metrics"), kind="metrics")
        storage.write_text(storage.join(out_dir, SUMMARY), metrics_markdown(rows, read_timings(out_dir)) + "\n")
        return rows


def _nothing_to_run(cfg: AC2Config, layout: RunLayout, state: record.Resume, log: Log) -> list[dict]:
    log(
        f"{layout.root} holds {state.done} finished iterations and run.iterations is {cfg.run.iterations}:"
        " nothing to run, and the run folder is left as it is"
    )
    return storage.read_rows(layout.output(state.done, "metrics"), kind="metrics")


def _run(
    cfg: AC2Config, layout: RunLayout, runner: Runner, log: Log, bootstrap_from: str | None, trackers: Trackers, tty
) -> None:
    _bootstrap(cfg, layout, runner, log, bootstrap_from, tty)
    done = layout.completed_iterations()
    if done:
        log(f"resuming {layout.root} after iteration {done}")
        prune(cfg, layout, done)  # in case the run that finished it was killed while it pruned
    if done == cfg.run.iterations:
        log(f"all {done} iterations are done: nothing to run")
    else:
        log(f"{cfg.algorithm} training ({runner.label}): iterations {done + 1}..{cfg.run.iterations}")
    log(HEADER)
    if done == 0:
        row0 = storage.read_rows(layout.bootstrap("metrics"), kind="metrics")[0]
        log(format_row(row0) + "   (initial policy)")
        trackers.log(row0)
    _iterations(cfg, layout, runner, done, log, trackers, tty)


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


def _bootstrap(cfg: AC2Config, layout: RunLayout, runner: Runner, log: Log, bootstrap_from: str | None, tty) -> None:
    if layout.has_bootstrap():
        return
    t0 = time.perf_counter()
    if bootstrap_from:
        adopt_bootstrap(cfg, layout, bootstrap_from)
        log(f"bootstrap adopted from {bootstrap_from}")
        return
    warm_log, close = bootstrap_log(log, tty=tty)
    try:
        runner.bootstrap(cfg, layout, warm_log)
    finally:
        close()
    log(f"bootstrap: {time.perf_counter() - t0:.1f}s")


def _iterations(cfg: AC2Config, layout: RunLayout, runner: Runner, done: int, log: Log, trackers: Trackers, tty) -> None:
    if done >= cfg.run.iterations:
        return
    t_start = time.perf_counter()
    progress = Progress("iterations", cfg.run.iterations, log=log, start=done, tty=tty)
    try:
        for it in range(done + 1, cfg.run.iterations + 1):
            t0 = time.perf_counter()
            seconds = runner.iteration(cfg, layout, it) or {}
            wall = time.perf_counter() - t0
            add_timing(layout.root, it, seconds or {"iteration": wall})
            rows = storage.read_rows(layout.output(it, "metrics"), kind="metrics")
            progress.update(it, f"{format_row(rows[-1])} {wall:6.1f}s")
            trackers.log(rows[-1], seconds)
            prune(cfg, layout, it, rows)
    finally:
        progress.close()
    log(f"done in {time.perf_counter() - t_start:.0f}s: {layout.root}")


def best_iteration(rows: list[dict]) -> int | None:
    """The iteration (>= 1) of the highest validation score; the earliest of equals."""
    scored = [r for r in rows if r["iteration"] >= 1 and r["val_score"] is not None]
    return max(scored, key=lambda r: (r["val_score"], -r["iteration"]))["iteration"] if scored else None


def prune(cfg: AC2Config, layout: RunLayout, it: int, rows: list[dict] | None = None) -> None:
    """Keep the checkpoints of the newest ``run.keep_models`` iterations and, with ``run.keep_best``,
    those of the best validation score so far; drop the rest (tables are kept).

    Called after each iteration: what it may drop is the iteration that just left the newest
    ones and a best that has just been beaten (both, on a resumed run, found from ``rows``).
    """
    if rows is None and cfg.run.keep_best:
        rows = storage.read_rows(layout.output(it, "metrics"), kind="metrics")
    keep = set(range(it - cfg.run.keep_models + 1, it + 1))
    best_now = best_iteration(rows) if cfg.run.keep_best else None
    best_before = best_iteration([r for r in rows if r["iteration"] < it]) if cfg.run.keep_best else None
    keep.add(best_now)
    for old in {it - cfg.run.keep_models, best_before} - keep:
        if old is not None and old >= 1:
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
