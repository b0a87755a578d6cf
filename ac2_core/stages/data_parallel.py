"""update_actor and update_critic over N processes: the stage launches them itself, under torchrun.

``training.num_processes`` processes (unset: the GPUs the task sees, 1 on CPU) each run
the whole stage function: they read the same artifacts, build the same batch, and their
trainer takes one optimizer step over all of it, each process running its share of the
micro-batches (``ac2_core.training.data_parallel``). Rank 0 alone publishes the
checkpoint, in the layout one process writes; the stage's stats are rank 0's, as the
stage's own typed stats object. One process trains inside the stage's own process, as
before, unless ``training.launch`` is ``always`` (the launcher path, exercised with one GPU).

The stage's ``run`` carries the decision (``launches``), so every caller launches the same
way: ``recipe.run_stage`` (a KFP task, ``ac2 stage``, both local runners) or a direct
call. Under the inprocess runner the stage's input checkpoints are dropped from memory
first: the launched processes train them from their files.
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING

from ac2_core import launch, storage, threads
from ac2_core.config import AC2Config, config_from_json, parallel
from ac2_core.storage import lineage

if TYPE_CHECKING:
    from ac2_core.stages.common import StageStats

MODULE = "ac2_core.stages.data_parallel"
STAGES = parallel.TRAINING_STAGES


def processes(cfg: AC2Config) -> int:
    """``training.num_processes``, or the GPUs this task sees when it trains on them (1 on CPU)."""
    from ac2_core.models.device import visible_gpus

    return parallel.layout(cfg, "train").resolve(visible_gpus(cfg.model.device))


def launched(cfg: AC2Config, store) -> bool:
    """Whether a stage called with ``store`` hands its work to launched processes.

    Not when ``store`` belongs to a launched process: that process is the work.
    """
    if store is not None and store.ranks is not None:
        return False
    return cfg.training.launch == "always" or processes(cfg) > 1


def launches(stage: str, stats: type[StageStats]):
    """Decorate a stage's ``run``: called where it should launch (``launched``), it runs in the
    launched processes instead and returns rank 0's ``stats``; otherwise it runs as written."""
    if stage not in STAGES:
        raise ValueError(f"{stage} does not train: only {', '.join(STAGES)} run over data-parallel processes")

    def wrap(fn):
        @functools.wraps(fn)  # the stage keeps its signature (the recipe's test and ac2 stage read it)
        def stage_run(cfg: AC2Config, *, iteration: int, store=None, **kwargs):
            if launched(cfg, store):
                return stats(**run(cfg, stage, iteration, kwargs, store))
            return fn(cfg, iteration=iteration, store=store, **kwargs)

        return stage_run

    return wrap


def run(cfg: AC2Config, stage: str, iteration: int, kwargs: dict, store=None) -> dict:
    """Run ``stage`` with ``kwargs`` (its URIs) in launched processes; rank 0's stats as a dict."""
    if store is not None:
        for uri in kwargs.values():
            if uri is not None:
                store.forget(uri)
    # the processes' manifests name the inputs as this call's do (a runner's paths relative to the run folder)
    recorded = lineage.current()
    named = {k: entry["uri"] for k, entry in recorded["inputs"].items()} if recorded else None
    n = processes(cfg)
    each = threads.per_process(cfg.model.threads, n)
    with launch.scratch(stage) as folder:
        config = launch.child_config(cfg, each)
        spec = {"stage": stage, "iteration": iteration, "kwargs": kwargs, "named": named, "config": config}
        launch.write_spec(folder, spec)
        launch.torchrun(MODULE, folder, n, threads_each=each, what=f"{stage} over {n} processes")
        return launch.read_result(folder, 0)


def _work(folder, spec: dict, ranks) -> None:
    from ac2_core.models.store import ModelStore
    from ac2_core.stages.recipe import run_stage

    cfg = config_from_json(spec["config"])
    store = ModelStore(cfg, ranks=ranks)
    with storage.using(cfg.storage):
        stats = run_stage(
            cfg, spec["stage"], iteration=spec["iteration"], kwargs=spec["kwargs"], store=store, named=spec["named"]
        )
    if ranks.writes:
        launch.write_result(folder, ranks.rank, stats.as_dict())


def main(argv: list[str]) -> int:
    """One launched process: join the group, run the stage, leave the group."""
    import os

    import torch

    from ac2_core.models.device import resolve_device
    from ac2_core.training.data_parallel import Ranks

    folder, spec = launch.read_spec(argv[0])
    ranks = Ranks(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    on_gpu = resolve_device(config_from_json(spec["config"]).model.device).type == "cuda"
    if on_gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # "cuda" is this process's GPU from here on
    torch.distributed.init_process_group("nccl" if on_gpu else "gloo")
    try:
        return launch.run_child(folder, ranks.rank, lambda: _work(folder, spec, ranks))
    finally:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    launch.exit_now(main(sys.argv[1:]))
