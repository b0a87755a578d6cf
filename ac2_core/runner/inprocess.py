"""The ``inprocess`` runner: the recipe's stages called one after another in this process.

It calls the same stage functions on the same run folder layout as the KFP pipeline, but
keeps the actor and critic in memory between stages (``ModelStore(keep_in_memory=True)``)
and pays the torch import once. Tests and benchmarks with many iterations use it, and it
is the runner for run folders on object storage.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass

from ac2_core import storage
from ac2_core.config import AC2Config
from ac2_core.models.store import ModelStore
from ac2_core.runner import loop
from ac2_core.runner.layout import RunLayout
from ac2_core.stages.common import StageStats
from ac2_core.stages.recipe import StageCall, calls

Log = loop.Log


def stage_calls(cfg: AC2Config, layout: RunLayout, it: int) -> list[StageCall]:
    """The stages of iteration ``it`` (0: the bootstrap) in the order they run, wired to ``layout``'s URIs."""
    return calls(cfg, it, layout.output)


def named_inputs(cfg: AC2Config, it: int) -> dict[str, dict[str, str | None]]:
    """Each stage's inputs of iteration ``it`` as its manifests name them: paths relative to the run folder."""
    return {call.stage: call.kwargs for call in calls(cfg, it, RunLayout.relative)}


def run_bootstrap(cfg: AC2Config, layout: RunLayout, log: Log = print) -> StageStats:
    (call,) = stage_calls(cfg, layout, 0)
    return call.run(cfg, log=log)


@dataclass(frozen=True)
class IterationRun:
    """What ``run_iteration`` did, each by stage name: the stage's stats, its wall seconds and its
    process CPU seconds (user + system)."""

    stats: dict[str, StageStats]
    seconds: dict[str, float]
    cpu_seconds: dict[str, float]


def run_iteration(cfg: AC2Config, layout: RunLayout, it: int, store: ModelStore) -> IterationRun:
    """Every stage of iteration ``it``, in order, with the models kept in ``store``."""
    done = IterationRun({}, {}, {})
    named = named_inputs(cfg, it)
    for call in stage_calls(cfg, layout, it):
        t0, c0 = time.perf_counter(), time.process_time()
        done.stats[call.stage] = call.run(cfg, store=store, named=named[call.stage])
        done.seconds[call.stage], done.cpu_seconds[call.stage] = time.perf_counter() - t0, time.process_time() - c0
    return done


class InProcess:
    """``loop.Runner`` in this process; it resolves ``model.device`` at once, so an absent cuda fails before any work."""

    label = "inprocess"

    def __init__(self, cfg: AC2Config, log: Log):
        self.store = ModelStore(cfg, keep_in_memory=True)
        log(f"models on {self.store.device} (model.device {cfg.model.device}), {self.store.threads}")

    def bootstrap(self, cfg: AC2Config, layout: RunLayout, log: Log) -> None:
        run_bootstrap(cfg, layout, log)

    def iteration(self, cfg: AC2Config, layout: RunLayout, it: int) -> dict[str, float]:
        # update_actor and update_critic take last iteration's models out of the store, so
        # it holds only this iteration's checkpoints (and the reference policy, if any).
        return run_iteration(cfg, layout, it, self.store).seconds


def run(cfg: AC2Config, out_dir: str, *, log: Log = print, **options) -> list[dict]:
    """``ac2 run --runner inprocess``: ``loop.run`` with the stages in this process, and its
    ``options`` (``bootstrap_from``, ``resume``, ``tty``); returns the metrics rows."""
    with storage.using(cfg.storage):  # endpoint, retries and artifact root of every stage below
        return loop.run(cfg, out_dir, lambda: nullcontext(InProcess(cfg, log)), log=log, **options)
