"""The ``deepspeed`` training backend: the torch ``Trainer``'s contract on a DeepSpeed engine.

- ZeRO stage 0-3 (``training.zero_stage``); bf16 when the model is bf16 (DeepSpeed keeps
  fp32 master weights); optional gradient checkpointing.
- The optimizer is the same ``torch.optim.AdamW(foreach=False)`` as the torch backend,
  handed to DeepSpeed as a client optimizer, so one step gives the same weights.
- ``step`` runs with ``managed_gradient_accumulation: false``: every ``backward`` only
  accumulates, and ``engine.step()`` is the single boundary, for any number of
  micro-batches. Losses arrive already normalized to the whole batch, so DeepSpeed must
  not divide them again (gradient_accumulation_steps is 1).
- Checkpoints: the optimizer state is written in the torch backend's layout
  (``optimizer.safetensors``, keyed ``<param name>::<exp_avg|exp_avg_sq|step>``), so either
  backend resumes from the other's checkpoint.
- One process, world size 1, is what the stages run as. DeepSpeed still needs a process
  group: one is created (gloo on CPU, nccl on GPU) when none exists, on a free local port.
- Under ZeRO-3, DeepSpeed replaces the parameters of the module it trains with empty
  placeholders. The rest of ac2 (saving, generation, scoring) needs whole weights, so
  ZeRO-3 trains a copy of the model and writes the gathered weights back after every
  step. That doubles the weights' memory, which is the price of one process; the other
  stages leave the model's parameters whole.
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ac2_core.training.optim_state import GROUPS, TENSORS, load_optimizer, save_optimizer
from ac2_core.training.schedule import WarmupFromOptimizerState

INSTALL_HINT = "training.backend is 'deepspeed' but DeepSpeed is not installed: pip install 'ac2[deepspeed]'"
ADAM_KEYS = ("exp_avg", "exp_avg_sq")


def _import_deepspeed():
    try:
        import deepspeed
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from None
    return deepspeed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed() -> None:
    """A process group for DeepSpeed: the launcher's, or a single-process one."""
    deepspeed = _import_deepspeed()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    # Launched by hand (a stage, a test): this process is the whole world.
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
    # the group is this process's own: close it at exit (NCCL warns of leaked resources otherwise)
    atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class Trainer(WarmupFromOptimizerState):
    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lr: float,
        weight_decay: float,
        max_grad_norm: float,
        warmup_steps: int = 0,
        zero_stage: int = 2,
        gradient_checkpointing: bool = False,
    ):
        if zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"training.zero_stage: expected 0, 1, 2 or 3, found {zero_stage}")
        deepspeed = _import_deepspeed()
        _check_same_device(model, deepspeed.accelerator.get_accelerator().device_name())
        init_distributed()
        self.model = model
        self.lr = lr
        self.warmup_steps = warmup_steps
        self.max_grad_norm = max_grad_norm
        self.zero_stage = zero_stage
        if gradient_checkpointing:
            _enable_gradient_checkpointing(model)
        # ZeRO-3 empties the parameters of the module it trains (module docstring).
        trained = copy.deepcopy(model) if zero_stage == 3 else model
        params = [p for p in trained.parameters() if p.requires_grad]
        # foreach=False: one fixed kernel order, as in the torch backend.
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=False)
        bf16 = next(model.parameters()).dtype == torch.bfloat16
        config = {
            "train_micro_batch_size_per_gpu": 1,  # nominal: ac2 hands over its own micro-batches
            "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,  # step() is the only boundary (module docstring)
            "gradient_clipping": max_grad_norm,
            "zero_optimization": {"stage": zero_stage},
            "zero_allow_untested_optimizer": True,  # torch's AdamW, the torch backend's optimizer
            "bf16": {"enabled": bf16},
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }
        self.engine, *_ = deepspeed.initialize(model=trained, optimizer=self.optimizer, config=config)
        self.engine.eval()

    def step(self, micro_batches: Iterable, loss_fn: Callable[[torch.nn.Module, object], tuple[torch.Tensor, dict]]) -> dict:
        """One optimizer step over all ``micro_batches``; returns summed stats and grad norm."""
        self.engine.train()
        totals: dict[str, float] = {}
        for mb in micro_batches:
            loss, stats = loss_fn(self.engine, mb)  # the engine's forward is the module's
            self.engine.backward(loss)
            for k, v in {"loss": float(loss.detach()), **stats}.items():
                totals[k] = totals.get(k, 0.0) + v
        for group in self.optimizer.param_groups:
            group["lr"] = self.current_lr()
        # ZeRO 1-3 and bf16 report the norm they clipped with; stage 0 in fp32 keeps the
        # module's own grads, whose norm is taken here (as torch's clip_grad_norm_ takes it).
        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        local_norm = torch.nn.utils.get_total_norm(grads) if grads and self.zero_stage == 0 else None
        self.engine.step()
        grad_norm = self.engine.get_global_grad_norm()
        grad_norm = local_norm if grad_norm is None else grad_norm
        self.engine.eval()
        self.model.eval()
        if self.zero_stage == 3:
            self._copy_weights_back()
        return totals | {"grad_norm": float(grad_norm)}

    # ------------------------------------------------------------ weights

    def _trained_params(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.engine.module.named_parameters() if p.requires_grad]

    @torch.no_grad()
    def _copy_weights_back(self) -> None:
        deepspeed = _import_deepspeed()
        mine = dict(self.model.named_parameters())
        trained = list(self.engine.module.named_parameters())
        with deepspeed.zero.GatheredParameters([p for _, p in trained]):
            for name, p in trained:
                mine[name].copy_(p.data.view_as(mine[name]))

    # ------------------------------------------------------------ optimizer state

    def save(self, folder: Path) -> None:
        if self.zero_stage == 0:  # the AdamW holds one state per parameter, as in the torch backend
            save_optimizer(self.optimizer, self.model, folder)
            return
        step = self.steps_taken
        tensors = {}
        if step > 0:
            deepspeed = _import_deepspeed()
            for name, p in self._trained_params():
                for key in ADAM_KEYS:
                    value = deepspeed.utils.safe_get_full_optimizer_state(p, key)
                    tensors[f"{name}::{key}"] = value.detach().float().cpu().contiguous().view(_shape(p))
                tensors[f"{name}::step"] = torch.tensor(float(step))
        save_file(tensors, str(folder / TENSORS))
        groups = [
            {k: v for k, v in g.items() if k != "params"} | {"params": [n for n, _ in self._trained_params()]}
            for g in self.optimizer.param_groups  # not state_dict(): ZeRO-3 empties the groups between steps
        ]
        (folder / GROUPS).write_text(json.dumps({"param_groups": groups}, indent=1, sort_keys=True) + "\n")

    def load(self, folder: Path) -> bool:
        """Restore state saved by either backend; False when the folder holds none."""
        if self.zero_stage == 0:
            return load_optimizer(self.optimizer, self.model, folder)
        if not (folder / TENSORS).exists():
            return False
        tensors = load_file(str(folder / TENSORS))
        if not tensors:
            return True  # saved before any step: nothing to restore
        params = dict(self._trained_params())
        unknown = sorted({key.rsplit("::", 1)[0] for key in tensors} - set(params))
        if unknown:
            raise ValueError(f"{folder / TENSORS}: optimizer state for unknown parameters {unknown[:3]}")
        steps = {float(t) for key, t in tensors.items() if key.endswith("::step")}
        if len(steps) != 1:
            raise ValueError(f"{folder / TENSORS}: expected one step count for all parameters, found {sorted(steps)}")
        step = steps.pop()
        # AdamW creates its state on its first step; create it (zeros) to write the moments into.
        # ZeRO 1/2 leave their flat fp32 partitions in AdamW's groups; ZeRO-3 puts one there only while it steps it.
        flats = getattr(self.engine.optimizer, "fp32_partitioned_groups_flat", None)
        for flat in flats or [f for group in self.optimizer.param_groups for f in group["params"]]:
            self.optimizer.state[flat] = {
                "step": torch.tensor(step),
                **{key: torch.zeros_like(flat, memory_format=torch.preserve_format) for key in ADAM_KEYS},
            }
        deepspeed = _import_deepspeed()
        for name, p in params.items():
            if getattr(p, "_hp_mapping", None) is not None:  # ZeRO 1/2: views into the new state
                flat = self.optimizer.param_groups[p._hp_mapping.param_group_index]["params"][0]
                p._hp_mapping.set_optim_state_fragment(flat, self.optimizer.state[flat])
            for key in ADAM_KEYS:
                value = tensors.get(f"{name}::{key}")
                if value is None:
                    raise ValueError(f"{folder / TENSORS}: no {key} for parameter {name}")
                deepspeed.utils.safe_set_full_optimizer_state(p, value.to(torch.float32), key)
        return True


def _check_same_device(model: torch.nn.Module, accelerator: str) -> None:
    """DeepSpeed moves the module it trains to its own accelerator (cuda when it sees one), which
    would leave ac2's model and the trained copy on different devices: refuse that up front."""
    found = next(model.parameters()).device.type
    if found != accelerator:
        raise ValueError(
            f"training.backend deepspeed trains on its accelerator ({accelerator}) but the model is on {found}:"
            f" set model.device to {accelerator if accelerator in ('cpu', 'cuda') else 'auto'}"
            f" (or select DeepSpeed's accelerator with DS_ACCELERATOR={found})"
        )


def _shape(p: torch.nn.Parameter) -> torch.Size:
    return getattr(p, "ds_shape", p.shape)  # ZeRO-3 placeholders keep the full shape in ds_shape


def _enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    for m in model.modules():  # the causal LM itself, or the critic's backbone
        if hasattr(m, "gradient_checkpointing_enable"):
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return
    raise ValueError(f"training.gradient_checkpointing: {type(model).__name__} has no HF model to checkpoint")
