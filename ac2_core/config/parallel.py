"""How many processes, and GPUs each, a stage works with: from the config and the GPUs a task sees.

- ``update_actor``, ``update_critic``: ``training.num_processes`` data-parallel processes,
  one GPU each.
- ``generate_chunks``, ``evaluate``, ``bootstrap`` (generation) and ``score_chunks`` (critic
  scoring): ``generation.num_processes`` processes. Each holds ``tensor_parallel_size`` GPUs
  where its backend is ``vllm`` (``generation.backend`` for generation,
  ``critic.scoring_backend`` for scoring), one GPU with ``hf``.
- Unset counts follow the GPUs the task sees (``gpus // gpus_each``); a task without GPUs
  works in one process.

``check_gpu_fit`` holds a config to what its ``cluster`` section (``config.cluster``) asks
Kubernetes for: a stage that runs on GPU nodes must use exactly the GPUs its task gets.
``AC2Config`` runs it as a validator, so every command that loads a config checks it. It
imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ac2_core.config import AC2Config

TRAINING_STAGES = ("update_actor", "update_critic")
SCORING_STAGES = ("score_chunks",)
GENERATION_STAGES = ("bootstrap", "generate_chunks", "evaluate")


@dataclass(frozen=True)
class Layout:
    """The processes of one stage: ``processes`` of ``gpus_each`` GPUs; the config fields that set them."""

    processes: int | None  # None: as many as the task's GPUs allow
    gpus_each: int
    processes_field: str
    gpus_each_field: str | None  # None: one GPU each, not a setting

    def resolve(self, visible_gpus: int) -> int:
        """Processes on a task that sees ``visible_gpus`` GPUs (0: a CPU task)."""
        if self.processes is not None:
            return self.processes
        if visible_gpus == 0:
            return 1
        return max(1, visible_gpus // self.gpus_each)


def role_of(stage: str) -> str | None:
    """What a stage spends its GPUs on: train, generate or score; None for a stage without models."""
    for role, stages in (("train", TRAINING_STAGES), ("score", SCORING_STAGES), ("generate", GENERATION_STAGES)):
        if stage in stages:
            return role
    return None


def layout(cfg: AC2Config, role: str) -> Layout:
    """How work of ``role`` (train, generate or score) spreads over processes and GPUs under ``cfg``."""
    if role == "train":
        return Layout(cfg.training.num_processes, 1, "training.num_processes", None)
    backend = cfg.critic.scoring_backend if role == "score" else cfg.generation.backend
    if backend == "vllm":
        g = cfg.generation
        return Layout(g.num_processes, g.tensor_parallel_size, "generation.num_processes", "generation.tensor_parallel_size")
    return Layout(cfg.generation.num_processes, 1, "generation.num_processes", None)


def check_gpu_fit(cfg: AC2Config) -> None:
    """ValueError naming both fields when a GPU stage's processes x GPUs each differ from its task's GPUs."""
    gpu = cfg.cluster.gpu
    if gpu.accelerator_count == 0:
        return
    count = gpu.accelerator_count
    for stage in gpu.stages:
        role = role_of(stage)
        if role is None:
            continue  # a stage of one process (sample_prefixes, check_readiness) uses what it is given
        lay = layout(cfg, role)
        each = f" x {lay.gpus_each_field} ({lay.gpus_each})" if lay.gpus_each_field else ""
        if lay.processes is None:
            if count % lay.gpus_each:
                raise ValueError(
                    f"cluster.gpu.accelerator_count ({count}) is not a multiple of {lay.gpus_each_field} ({lay.gpus_each}):"
                    f" {stage} would leave GPUs idle"
                )
            continue
        if lay.processes * lay.gpus_each != count:
            raise ValueError(
                f"cluster.gpu.accelerator_count ({count}) does not fit {lay.processes_field} ({lay.processes}){each}:"
                f" {stage} would use {lay.processes * lay.gpus_each} GPUs of the {count} its task gets"
            )
