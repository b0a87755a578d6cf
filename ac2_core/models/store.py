"""Actor and critic checkpoints at artifact URIs, optionally kept in memory.

A checkpoint is a published model directory (``storage.publish_dir``): the HF files,
the optimizer state (``training.optim_state``) and ``ac2_state.json`` with the version.
Under ``kfp`` every stage is a new process and loads from storage. The ``inprocess``
runner passes one ``ModelStore(keep_in_memory=True)`` to all stages, so a model written
by one stage is handed to the next without a reload; the files are written all the same.
Every model it loads is put on ``model.device`` (``ModelStore.device``).
Under kfp.local, the warm task host loads the models a task will read before it forks the
task's worker (``LoadedModels``); the worker's store finds them by content hash and builds
nothing, though it still verifies the files it was given.
In a group of processes that torchrun started (``ranks``), each process trains its share
and rank 0 alone publishes the checkpoint (``save``).
"""

from __future__ import annotations

import copy
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ac2_core import storage
from ac2_core.config import AC2Config
from ac2_core.models.state import STATE, loading, parse_state
from ac2_core.models.tokenizer import load_tokenizer

# torch and transformers are imported where weights are loaded, trained or saved: a stage
# that needs only a tokenizer (score_chunks under grpo) then starts without them (seconds
# per fresh KFP task)
if TYPE_CHECKING:
    from ac2_core.training.data_parallel import Ranks
    from ac2_core.training.torch_backend import Trainer


@dataclass
class Checkpoint:
    """A loaded actor (``model`` is a causal LM) or critic (``model`` is a ``Critic``)."""

    kind: str  # actor | critic
    model: object
    tokenizer: object
    version: int
    source: Path | None = None  # local folder it was loaded from; holds its optimizer state
    trainer: Trainer | None = None
    trained_tokens: int = 0  # tokens forwarded and backpropagated by the update that wrote it
    uri: str | None = None  # the artifact it was loaded from: named when its optimizer state cannot be read
    stats: dict | None = None  # the update's training statistics (``update_stats``), for evaluate's metrics row


class LoadedModels:
    """Checkpoints loaded on the CPU ahead of time, by content hash, for processes forked afterwards.

    The kfp.local task host preloads the models a task names before it forks the task's
    worker; the worker's ``ModelStore(loaded=...)`` then takes them from its own copy of the
    host's memory instead of building them again, and the next task that reads the same
    artifact finds it too. Artifacts are immutable and the key is the manifest's content
    hash (with the dtype and code settings that shape the loaded model), so a hit is the
    model the worker would have loaded. The newest checkpoints are kept up to ``max_bytes``
    of weights. A process that loaded them gets a deep copy from ``get``: only a forked
    worker may train the shared objects, in its own copy-on-write memory.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._owner = os.getpid()
        self._models: OrderedDict[tuple, tuple[Checkpoint, int]] = OrderedDict()

    def key(self, cfg: AC2Config, uri: str, kind: str) -> tuple:
        return (storage.content_hash(uri), kind, cfg.model.dtype, cfg.model.trust_remote_code)

    def preload(self, cfg: AC2Config, uri: str, kind: str) -> bool:
        """Load ``uri`` on the CPU unless it is loaded already; False when it was (or is too large to keep)."""
        key = self.key(cfg, uri, kind)
        if key in self._models:
            self._models.move_to_end(key)
            return False
        ckpt = _load_checkpoint(cfg, uri, kind, device=None)
        size = sum(p.numel() * p.element_size() for p in ckpt.model.parameters())
        if size > self.max_bytes:
            return False
        self._models[key] = (ckpt, size)
        while sum(size for _, size in self._models.values()) > self.max_bytes:
            self._models.popitem(last=False)
        return True

    def get(self, cfg: AC2Config, uri: str, kind: str) -> Checkpoint | None:
        hit = self._models.get(self.key(cfg, uri, kind))
        if hit is None:
            return None
        return copy.deepcopy(hit[0]) if os.getpid() == self._owner else hit[0]

    def __len__(self) -> int:
        return len(self._models)


def _load_checkpoint(cfg: AC2Config, uri: str, kind: str, device) -> Checkpoint:
    """Verify and load the checkpoint at ``uri``; on ``device`` when given, else on the CPU."""
    from ac2_core.models.critic import Critic
    from ac2_core.models.hf import load_model

    if kind not in ("actor", "critic"):
        raise ValueError(f"unknown checkpoint kind {kind!r}")
    folder = storage.local_model_dir(uri, kind=kind)  # every file verified against the manifest
    with loading(uri, f"this {kind} model directory"):  # files that match their manifest can still be damaged
        version = parse_state(uri, (folder / STATE).read_bytes())["version"]
        if kind == "actor":
            model, tok = load_model(folder, dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)
        else:
            model, tok = Critic.load(folder, dtype=cfg.model.dtype)
    # loaded on the CPU, then moved (a no-op on cpu); the critic's float32 head keeps its dtype
    return Checkpoint(kind, model if device is None else model.to(device), tok, version, source=folder, uri=uri)


class ModelStore:
    def __init__(
        self,
        cfg: AC2Config,
        *,
        keep_in_memory: bool = False,
        ranks: Ranks | None = None,
        loaded: LoadedModels | None = None,
    ):
        self.cfg = cfg
        self.keep_in_memory = keep_in_memory
        self.ranks = ranks  # this process's place in a launched group; None: a stage's own process
        self.loaded = loaded  # checkpoints a parent process loaded before it forked this one
        self._memory: dict[str, Checkpoint] = {}
        self._device = None
        self.threads = None  # the ac2_core.threads.Threads in effect, once ``device`` is resolved

    @property
    def device(self):
        """``model.device`` resolved on this machine (a ``torch.device``); every loaded model is put there.

        Resolved on first use, so a stage that needs no weights never imports torch; torch's
        thread count is set then too (``model.threads``, ``ac2_core.threads``; ``self.threads`` says which).
        ConfigError naming ``model.device`` when cuda is asked for and absent.
        """
        if self._device is None:
            from ac2_core.models.device import resolve_device
            from ac2_core.threads import use_threads

            self._device = resolve_device(self.cfg.model.device)
            self.threads = use_threads(self.cfg.model.threads)
        return self._device

    # ------------------------------------------------------------------ loading

    def load(self, uri: str, *, kind: str) -> Checkpoint:
        """A checkpoint for reading (generation, scoring); never modify it."""
        if uri in self._memory:
            return self._memory[uri]
        ckpt = self._from_storage(uri, kind)
        if self.keep_in_memory:
            self._memory[uri] = ckpt
        return ckpt

    def tokenizer(self, uri: str, *, kind: str):
        """Only the tokenizer of a checkpoint (no weights are loaded unless already in memory)."""
        if uri in self._memory:
            return self._memory[uri].tokenizer
        if self.loaded is not None and (hit := self.loaded.get(self.cfg, uri, kind)) is not None:
            return hit.tokenizer
        folder = storage.local_model_dir(uri, kind=kind)
        with loading(uri, f"the tokenizer of this {kind} model directory"):
            return load_tokenizer(folder)

    def take(self, uri: str, *, kind: str) -> Checkpoint:
        """A checkpoint to train: the caller owns it, and ``uri`` is no longer served from memory."""
        ckpt = self._memory.pop(uri, None) or self._from_storage(uri, kind)
        return ckpt

    def forget(self, uri: str) -> None:
        """Drop ``uri`` from memory (other processes are about to train it from its files)."""
        self._memory.pop(uri, None)

    def _from_storage(self, uri: str, kind: str) -> Checkpoint:
        device = self.device  # an absent cuda is an error before any weights are read
        if self.loaded is not None and (hit := self.loaded.get(self.cfg, uri, kind)) is not None:
            folder = storage.local_model_dir(uri, kind=kind)  # every file verified, as without the hit
            return Checkpoint(kind, hit.model.to(device), hit.tokenizer, hit.version, source=folder, uri=uri)
        return _load_checkpoint(self.cfg, uri, kind, device)

    def trainer(self, ckpt: Checkpoint) -> Trainer:
        """The checkpoint's optimizer, restored from its folder the first time."""
        if ckpt.trainer is None:
            section = self.cfg.actor if ckpt.kind == "actor" else self.cfg.critic
            hyper = dict(
                lr=section.lr,
                weight_decay=section.weight_decay,
                max_grad_norm=section.max_grad_norm,
                warmup_steps=section.lr_warmup_steps,
                ranks=self.ranks,
            )
            match self.cfg.training.backend:
                case "torch":
                    from ac2_core.training.torch_backend import Trainer

                    ckpt.trainer = Trainer(ckpt.model, **hyper)
                case "deepspeed":
                    from ac2_core.training.deepspeed_backend import Trainer as DeepSpeedTrainer

                    t = self.cfg.training
                    ckpt.trainer = DeepSpeedTrainer(
                        ckpt.model, **hyper, zero_stage=t.zero_stage, gradient_checkpointing=t.gradient_checkpointing
                    )
                case other:
                    raise ValueError(f"training.backend: unknown backend {other!r}")
            if ckpt.source is not None:
                with loading(ckpt.uri or str(ckpt.source), f"the optimizer state of this {ckpt.kind} model directory"):
                    ckpt.trainer.load(ckpt.source)
        return ckpt.trainer

    # ------------------------------------------------------------------- saving

    def save(self, uri: str, ckpt: Checkpoint, *, stage: str, config_hash: str | None = None) -> str | None:
        """Publish ``ckpt`` at ``uri`` (weights, tokenizer, optimizer state, version); its content hash.

        In a launched group every process calls it, since gathering sharded weights and
        optimizer state takes them all; rank 0 writes, and the others return None.
        """
        if ckpt.trainer is None or self.ranks is None:
            return self._publish(uri, ckpt, stage=stage, config_hash=config_hash)
        with ckpt.trainer.whole_weights():
            if self.ranks.writes:
                return self._publish(uri, ckpt, stage=stage, config_hash=config_hash)
            ckpt.trainer.save(None)
            return None

    def _publish(self, uri: str, ckpt: Checkpoint, *, stage: str, config_hash: str | None) -> str:
        config_hash = config_hash or self.cfg.config_hash()
        # Weights on a GPU need no copy here: safetensors moves each tensor to the CPU as it
        # writes it, so the files are those a CPU run writes (and optimizer state is saved from .cpu()).
        with storage.publish_dir(uri, kind=ckpt.kind, stage=stage, config_hash=config_hash) as folder:
            if ckpt.kind == "actor":
                from ac2_core.models.hf import save_model

                save_model(ckpt.model, ckpt.tokenizer, folder)
            else:
                ckpt.model.save(folder, ckpt.tokenizer)
            if ckpt.trainer is not None:
                ckpt.trainer.save(folder)
            state = {"kind": ckpt.kind, "version": ckpt.version, "trained_tokens": ckpt.trained_tokens}
            if ckpt.stats is not None:
                state["stats"] = ckpt.stats
            (folder / STATE).write_text(json.dumps(state, sort_keys=True) + "\n")
        if self.keep_in_memory:
            ckpt.source = None  # its optimizer state now lives in ckpt.trainer
            self._memory[uri] = ckpt
        return storage.content_hash(uri)
