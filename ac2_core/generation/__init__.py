"""Generation backends. ``hf`` is the CPU default; ``vllm`` is the GPU default."""

from __future__ import annotations

from collections.abc import Callable

from ac2_core.generation import sharded
from ac2_core.generation.hf import Sample, generate


def generate_for(
    cfg,
    model,
    model_uri: str | None,
    contexts: list[list[int]],
    budgets: list[int],
    *,
    n: int,
    eos_id: int,
    pad_id: int,
    seed: int,
    temperature: float,
    progress: Callable[[int, int], None] | None = None,
) -> list[list[Sample]]:
    """``generate`` on the backend of ``cfg.generation``: the in-memory ``model`` (hf), or
    the checkpoint published at ``model_uri`` (vllm, which loads weights from files).

    A model that exists only in memory (``model_uri`` None: the bootstrap's warm start)
    is always decoded by hf, in this process, since vLLM and other processes can only load
    published weights. With several generating processes (``generation.num_processes``)
    the work is shared out among them (``generation.sharded``), with the same samples.
    """
    backend = cfg.generation.backend if model_uri is not None else "hf"
    if model_uri is not None and sharded.wanted(cfg, "generate"):  # generation.num_processes processes
        kw = dict(n=n, eos_id=eos_id, pad_id=pad_id, seed=seed, temperature=temperature, progress=progress)
        return sharded.generate(cfg, model_uri, contexts, budgets, **kw)
    match backend:
        case "hf":
            return generate(
                model,
                contexts,
                budgets,
                n=n,
                eos_id=eos_id,
                pad_id=pad_id,
                seed=seed,
                temperature=temperature,
                batch_size=cfg.generation.batch_size,
                progress=progress,
            )
        case "vllm":
            from ac2_core import storage
            from ac2_core.generation import vllm as vllm_backend

            return vllm_backend.generate(
                storage.local_model_dir(model_uri, kind="actor"),
                contexts,
                budgets,
                n=n,
                eos_id=eos_id,
                seed=seed,
                temperature=temperature,
                settings=vllm_backend.EngineSettings.from_config(cfg),
                progress=progress,
            )
        case other:
            raise ValueError(f"generation.backend: unknown backend {other!r}")


__all__ = ["Sample", "generate", "generate_for"]
