"""Generation and critic scoring spread over ``generation.num_processes`` processes, each on its own GPUs.

The stage's process writes the work to a scratch folder, starts the processes
(``launch.spawn``: they never talk to each other) and puts their answers together. Each
process loads the checkpoint from its files and takes a share:

- ``hf`` generation: the batches of ``hf.batch_plan``, dealt out round robin. Batch ``b``
  samples from seed stream ``b`` wherever it runs, so the samples are those of one process,
  token for token.
- ``hf`` critic scoring: the batches of ``scoring.score_plan``, the same way: the same
  batches, so the same values.
- ``vllm``: contexts (or critic inputs) dealt out round robin, one engine per process over
  ``generation.tensor_parallel_size`` GPUs. A request's seed comes from its context's place
  in the whole list, so a sample does not depend on which process drew it.

Answers come back as JSON: token ids, and log-probs and values as the floats they are.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from ac2_core import launch, storage, threads
from ac2_core.config import AC2Config, config_from_json, parallel
from ac2_core.generation.hf import Sample
from ac2_core.models.device import visible_gpus

MODULE = "ac2_core.generation.sharded"


def processes(cfg: AC2Config, role: str) -> int:
    """Processes that generate (``role`` "generate") or score ("score"): ``generation.num_processes``,
    or the task's GPUs per engine."""
    return parallel.layout(cfg, role).resolve(visible_gpus(cfg.model.device))


def wanted(cfg: AC2Config, role: str) -> bool:
    """Whether generation (or scoring) runs in launched processes rather than in the stage's own."""
    return cfg.generation.launch == "always" or processes(cfg, role) > 1


def generate(
    cfg: AC2Config,
    model_uri: str,
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
    """``generate_for`` over the generating processes: P lists of ``n`` samples, in input order."""
    job = dict(kind="generate", uri=model_uri, contexts=contexts, budgets=budgets, n=n, eos_id=eos_id, pad_id=pad_id)
    shares = _run(cfg, "generate", job | dict(seed=seed, temperature=temperature))
    out: list[list[Sample | None]] = [[None] * n for _ in contexts]
    for share in shares:
        for p, j, token_ids, logprobs, reason in share:
            out[p][j] = Sample(token_ids, logprobs, reason)
    if progress:
        progress(len(contexts) * n, len(contexts) * n)
    return out  # type: ignore[return-value]


def score(cfg: AC2Config, critic_uri: str, inputs: list[list[int]], *, pad_id: int) -> list[float]:
    """V of each critic input, in input order, over the scoring processes."""
    shares = _run(cfg, "score", dict(kind="score", uri=critic_uri, inputs=inputs, pad_id=pad_id))
    values = {tuple(x): v for share in shares for x, v in share}
    return [values[tuple(x)] for x in inputs]


def _run(cfg: AC2Config, role: str, job: dict) -> list:
    n = processes(cfg, role)
    devices = _devices(cfg, role, n)
    each = threads.per_process(cfg.model.threads, n)
    with launch.scratch(role) as folder:
        launch.write_spec(folder, job | {"config": launch.child_config(cfg, each)})
        launch.spawn(MODULE, folder, devices, n, threads_each=each, what=f"{role} over {n} processes")
        return [launch.read_result(folder, rank) for rank in range(n)]


def _devices(cfg: AC2Config, role: str, n: int) -> list[list[str]] | None:
    """Each process's CUDA_VISIBLE_DEVICES entries: consecutive groups of the task's GPUs; None on CPU."""
    visible = visible_gpus(cfg.model.device)
    if visible == 0:
        return None
    lay = parallel.layout(cfg, role)
    each = lay.gpus_each
    if n * each > visible:
        raise ValueError(f"{lay.processes_field} ({n}) x {each} GPUs each needs {n * each} GPUs; this task sees {visible}")
    names = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = names.split(",")[:visible] if names else [str(i) for i in range(visible)]
    return [ids[r * each : (r + 1) * each] for r in range(n)]


# ---------------------------------------------------------------- one launched process


def _work(spec: dict, rank: int, size: int):
    cfg = config_from_json(spec["config"])
    backend = cfg.critic.scoring_backend if spec["kind"] == "score" else cfg.generation.backend
    with storage.using(cfg.storage):
        match (spec["kind"], backend):
            case ("generate", "hf"):
                return _generate_hf(cfg, spec, rank, size)
            case ("generate", "vllm"):
                return _generate_vllm(cfg, spec, rank, size)
            case ("score", "hf"):
                return _score_hf(cfg, spec, rank, size)
            case ("score", "vllm"):
                return _score_vllm(cfg, spec, rank, size)
    raise ValueError(f"unknown sharded job {spec['kind']!r} on backend {backend!r}")


def _generate_hf(cfg, spec, rank, size) -> list:
    from ac2_core.generation.hf import batch_plan, decode_batch
    from ac2_core.models.store import ModelStore

    model = ModelStore(cfg).load(spec["uri"], kind="actor").model
    contexts, budgets = spec["contexts"], spec["budgets"]
    plan = batch_plan(contexts, budgets, n=spec["n"], batch_size=cfg.generation.batch_size)
    out = []
    for b in range(rank, len(plan), size):
        kw = dict(eos_id=spec["eos_id"], pad_id=spec["pad_id"], seed=spec["seed"], temperature=spec["temperature"])
        samples = decode_batch(model, contexts, budgets, plan[b], b, greedy=False, **kw)
        out += [[p, j, s.token_ids, s.logprobs, s.finish_reason] for (p, j), s in zip(plan[b], samples)]
    return out


def _generate_vllm(cfg, spec, rank, size) -> list:
    from ac2_core.generation import vllm as vllm_backend

    mine = list(range(rank, len(spec["contexts"]), size))
    if not mine:
        return []
    groups = vllm_backend.generate(
        storage.local_model_dir(spec["uri"], kind="actor"),
        [spec["contexts"][p] for p in mine],
        [spec["budgets"][p] for p in mine],
        n=spec["n"],
        eos_id=spec["eos_id"],
        seed=spec["seed"],
        temperature=spec["temperature"],
        settings=vllm_backend.EngineSettings.from_config(cfg),
        indices=mine,
    )
    return [[p, j, s.token_ids, s.logprobs, s.finish_reason] for p, group in zip(mine, groups) for j, s in enumerate(group)]


def _score_hf(cfg, spec, rank, size) -> list:
    from ac2_core.generation.scoring import score_batch, score_plan
    from ac2_core.models.store import ModelStore

    critic = ModelStore(cfg).load(spec["uri"], kind="critic").model
    plan = score_plan(spec["inputs"], batch_size=cfg.critic.score_batch_size)
    return [
        [list(x), v]
        for b in range(rank, len(plan), size)
        for x, v in zip(plan[b], score_batch(critic, plan[b], pad_id=spec["pad_id"]))
    ]


def _score_vllm(cfg, spec, rank, size) -> list:
    from ac2_core.generation import vllm as vllm_backend
    from ac2_core.generation.scoring import unique_inputs

    mine = unique_inputs(spec["inputs"])[rank::size]
    if not mine:
        return []
    folder = storage.local_model_dir(spec["uri"], kind="critic")
    head = _value_head(folder)  # the backbone runs in the engine; V = sigmoid(head(h_last)) in torch
    values = vllm_backend.score(folder, head, [list(x) for x in mine], settings=vllm_backend.EngineSettings.from_config(cfg))
    return [[list(x), v] for x, v in zip(mine, values)]


def _value_head(folder):
    """The critic's float32 scalar head, from its own file, on the CPU."""
    import torch
    from safetensors.torch import load_file

    from ac2_core.models.critic import HEAD_FILE

    state = load_file(str(folder / HEAD_FILE))
    head = torch.nn.Linear(state["weight"].shape[1], 1)
    head.load_state_dict(state)
    return head


def main(argv: list[str]) -> int:
    folder, spec = launch.read_spec(argv[0])
    rank, size = int(argv[1]), int(argv[2])
    return launch.run_child(folder, rank, lambda: launch.write_result(folder, rank, _work(spec, rank, size)))


if __name__ == "__main__":
    launch.exit_now(main(sys.argv[1:]))
