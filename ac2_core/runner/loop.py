"""The iteration loop of a local run, the same for both runners.

``run`` checks the run folder against the config (``record``), makes (or adopts) the
bootstrap, resumes after the last finished iteration, runs the rest one by one, shows a
row for each with progress and ETA, hands it to the trackers and drops old checkpoints. What a runner adds
is how one pipeline of stages is executed (``Runner``): ``ac2_core.runner.inprocess``
calls the stage functions in this process; ``pipelines.local`` runs the KFP pipelines
through kfp.local. Either way the artifacts land at their names in ``RunLayout``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from ac2_core import storage
from ac2_core.config import AC2Config
from ac2_core.runner import record
from ac2_core.runner.layout import RunLayout
from ac2_core.runner.progress import Progress, bootstrap_log
from ac2_core.runner.report import HEADER, format_row, metrics_markdown
from ac2_core.runner.timings import add_timing, read_timings
from ac2_core.runner.tracking import Trackers
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
    runner: Runner,
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
    """
    layout = RunLayout(out_dir)
    state = record.check(cfg, layout, resume=resume)
    if state.fewer(cfg):
        log(
            f"{out_dir} holds {state.done} finished iterations and run.iterations is {cfg.run.iterations}:"
            " nothing to run, and the run folder is left as it is"
        )
        return storage.read_rows(layout.output(state.done, "metrics"), kind="metrics")
    trackers = Trackers(cfg, out_dir)
    record.record(cfg, layout)
    try:
        _bootstrap(cfg, layout, runner, log, bootstrap_from, tty)
        done = layout.completed_iterations()
        if done:
            log(f"resuming {out_dir} after iteration {done}")
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
    finally:
        trackers.close()
    rows = storage.read_rows(layout.output(cfg.run.iterations, "metrics"), kind="metrics")
    storage.write_text(storage.join(out_dir, SUMMARY), metrics_markdown(rows, read_timings(out_dir)) + "\n")
    return rows


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
    source = RunLayout(source_root)
    for name in BOOTSTRAP_STAGE.outputs:
        uri = source.bootstrap(name)
        if not storage.exists(uri):
            raise ValueError(f"{source_root}: no finished bootstrap to adopt (missing {uri})")
        if storage.read_manifest(uri).config_hash != cfg.bootstrap_hash():
            raise ValueError(
                f"{uri} was bootstrapped with other model/task/warm_start/eval/seed settings; it cannot start this run"
            )
    for name in BOOTSTRAP_STAGE.outputs:  # metrics last: the bootstrap counts as made once it is there
        storage.copy(source.bootstrap(name), layout.bootstrap(name))
