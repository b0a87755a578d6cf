"""The iteration loop of a local run, the same for both runners.

``run`` makes (or adopts) the bootstrap, resumes after the last finished iteration, runs
the rest one by one, prints a row for each and drops old checkpoints. What a runner adds
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


def run(cfg: AC2Config, out_dir: str, runner: Runner, *, log: Log = print, bootstrap_from: str | None = None) -> list[dict]:
    """Bootstrap (once, or adopt ``bootstrap_from``'s), then iterations up to ``cfg.run.iterations``;
    returns the metrics rows. A run folder that holds finished iterations is resumed after the last."""
    layout = RunLayout(out_dir)
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
