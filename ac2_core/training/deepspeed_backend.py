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
- Processes: a stage trains either inside its own process (``ranks`` None: one process,
  whose models later stages of the inprocess runner reuse) or in a group that torchrun
  started (``ranks``: ``ac2_core.stages.data_parallel``). DeepSpeed needs a process group
  either way: inside a stage one is created (gloo on CPU, nccl on GPU) on a free local
  port; a launched group brings its own.
- In a group each process runs its share of the micro-batches (``training.data_parallel``).
  DeepSpeed averages gradients over the processes, and ac2's losses are already normalized
  to the whole batch, so each loss is multiplied by the group's size: the average is then
  the sum, the gradient of one process over the whole batch. ZeRO 1-3 partition the
  optimizer state (1), the gradients (2) and the parameters (3) over the processes.
- Under ZeRO-3, DeepSpeed replaces the parameters of the module it trains with empty
  placeholders. In a group that is the model itself: no process holds whole weights while
  it trains, and saving gathers them (``whole_weights``) for rank 0 to write. Inside a
  stage's own process the rest of ac2 (generation, scoring) needs the model whole
  afterwards, so there ZeRO-3 trains a copy and writes the gathered weights back after
  every step; with one process there is nothing to shard anyway.
- ZeRO stage 0 runs in one process only: its gradient norm is not the group's
  (``training.zero_stage``; the torch backend is the replicated data parallelism).
- DeepSpeed compiles its CPU communication op (``deepspeed_shm_comm``) with torch's JIT
  extension loader when a process first sets up its communication. torch guards a build
  folder with a lock file that only the building process removes: a build killed halfway
  (a launched rank dies with its stage, ``ac2_core.launch``) leaves it, and every later
  process waits for it forever, asleep. ``build_ops`` builds the op first, in a folder of
  this Python environment's own (torch's default one is shared by all of a user's
  environments, which rebuild it in turn), under a lock that the kernel drops however its
  holder ends; holding that, a lock file of torch's can only be a killed build's.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import fcntl
import hashlib
import json
import os
import socket
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ac2_core.training import data_parallel
from ac2_core.training.data_parallel import Ranks
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


EXTENSIONS = "TORCH_EXTENSIONS_DIR"  # where torch's JIT loader builds (read when it builds; launched processes inherit it)
BUILD_LOCK = "ac2-build.lock"  # held (flock) while an op is built in ``extensions_dir``


def extensions_dir() -> Path:
    """This Python environment's folder for torch's JIT-built extensions: ``ac2-<hash of sys.prefix>``
    under ``TORCH_EXTENSIONS_DIR`` if set, else under torch's default folder."""
    name = f"ac2-{hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]}"
    base = os.environ.get(EXTENSIONS)
    if base and Path(base).name == name:  # set by the process that launched this one
        return Path(base)
    from torch.utils.cpp_extension import get_default_build_root

    return Path(base or get_default_build_root()) / name


def build_ops() -> None:
    """Build (or find built) DeepSpeed's CPU communication op before DeepSpeed asks for it, in
    ``extensions_dir``, one process at a time; DeepSpeed then takes it from its cache of loaded ops.

    The lock (``flock``) goes with its holder, however that ends. Every build in the folder
    happens under it, so a lock file of torch's found while holding it is a killed build's.
    """
    from deepspeed.accelerator import get_accelerator
    from deepspeed.comm.torch import build_shm_op

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None:  # an accelerator without it: DeepSpeed builds nothing either
        return
    folder = extensions_dir()
    os.environ[EXTENSIONS] = str(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / BUILD_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed, or its process ends
        (folder / builder.name / "lock").unlink(missing_ok=True)
        build_shm_op()  # what DeepSpeed's communication setup calls: the same op, or None where it takes none


def init_distributed() -> None:
    """A process group for DeepSpeed: the launcher's, or a single-process one."""
    deepspeed = _import_deepspeed()
    build_ops()  # before DeepSpeed's communication setup (here, or deepspeed.initialize in a launched group)
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
        ranks: Ranks | None = None,
    ):
        if zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"training.zero_stage: expected 0, 1, 2 or 3, found {zero_stage}")
        if zero_stage == 0 and ranks is not None and ranks.size > 1:
            raise ValueError(
                f"training.zero_stage 0 trains in one process, but training.num_processes resolved to {ranks.size}:"
                " use ZeRO stage 1-3, or training.backend torch"
            )
        deepspeed = _import_deepspeed()
        _check_same_device(model, deepspeed.accelerator.get_accelerator().device_name())
        init_distributed()
        self.model = model
        self.lr = lr
        self.warmup_steps = warmup_steps
        self.max_grad_norm = max_grad_norm
        self.zero_stage = zero_stage
        self.ranks = ranks
        if gradient_checkpointing:
            _enable_gradient_checkpointing(model)
        # ZeRO-3 empties the parameters of the module it trains (module docstring): inside a
        # stage's own process it trains a copy, so that the model stays whole there.
        self.copies_back = zero_stage == 3 and ranks is None
        trained = copy.deepcopy(model) if self.copies_back else model
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
        size = 1 if self.ranks is None else self.ranks.size
        for mb, weight in data_parallel.share(list(micro_batches), self.ranks):
            loss, stats = loss_fn(self.engine, mb)  # the engine's forward is the module's
            # DeepSpeed averages over the group; losses normalized to the whole batch must be summed
            self.engine.backward(loss if weight * size == 1.0 else loss * (weight * size))
            data_parallel.add_totals(totals, loss, stats, weight)
        if size > 1:
            totals = data_parallel.all_reduce_totals(totals, next(self.engine.module.parameters()).device)
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
        if self.copies_back:
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

    @contextlib.contextmanager
    def whole_weights(self) -> Iterator[None]:
        """Inside, the model's parameters hold its whole weights: in a group under ZeRO-3 they are
        gathered on every process (all must enter), for the time of a save; otherwise they are whole."""
        if self.zero_stage == 3 and not self.copies_back:
            deepspeed = _import_deepspeed()
            with deepspeed.zero.GatheredParameters(list(self.engine.module.parameters()), modifier_rank=None):
                yield
        else:
            yield

    # ------------------------------------------------------------ optimizer state

    def save(self, folder: Path | None) -> None:
        """Write the optimizer state to ``folder``. Under ZeRO 1-3 every process of a group must
        call it (the state is gathered from all of them); those that do not publish pass None."""
        if self.zero_stage == 0:  # the AdamW holds one state per parameter, as in the torch backend
            if folder is not None:
                save_optimizer(self.optimizer, self.model, folder)
            return
        step = self.steps_taken
        tensors = {}
        if step > 0:
            deepspeed = _import_deepspeed()
            for name, p in self._trained_params():
                for key in ADAM_KEYS:
                    value = deepspeed.utils.safe_get_full_optimizer_state(p, key)  # collective in a group
                    if folder is not None:
                        tensors[f"{name}::{key}"] = value.detach().float().cpu().contiguous().view(_shape(p))
                tensors[f"{name}::step"] = torch.tensor(float(step))
        if folder is None:
            return
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
        # read one tensor at a time: every process of a group reads the whole file, and keeps only its partition
        with safe_open(str(folder / TENSORS), framework="pt") as tensors:
            return self._load_state(folder / TENSORS, tensors)

    def _load_state(self, path: Path, tensors) -> bool:
        keys = set(tensors.keys())
        if not keys:
            return True  # saved before any step: nothing to restore
        params = dict(self._trained_params())
        unknown = sorted({key.rsplit("::", 1)[0] for key in keys} - set(params))
        if unknown:
            raise ValueError(f"{path}: optimizer state for unknown parameters {unknown[:3]}")
        steps = {float(tensors.get_tensor(key)) for key in sorted(keys) if key.endswith("::step")}
        if len(steps) != 1:
            raise ValueError(f"{path}: expected one step count for all parameters, found {sorted(steps)}")
        step = steps.pop()
        # AdamW creates its state on its first step; create it (zeros) to write the moments into.
        # ZeRO 1/2 leave their flat fp32 partitions in AdamW's groups; ZeRO-3 puts one there only while it steps it.
        flats = getattr(self.engine.optimizer, "fp32_partitioned_groups_flat", None)
        for flat in flats or [f for group in self.optimizer.param_groups for f in group["params"]]:
            self.optimizer.state[flat] = {
                "step": torch.tensor(step),
                **{key: torch.zeros_like(flat, memory_format=torch.preserve_format) for key in ADAM_KEYS},
            }
        for name, p in params.items():
            if getattr(p, "_hp_mapping", None) is not None:  # ZeRO 1/2: views into the new state
                flat = self.optimizer.param_groups[p._hp_mapping.param_group_index]["params"][0]
                p._hp_mapping.set_optim_state_fragment(flat, self.optimizer.state[flat])
            for key in ADAM_KEYS:
                if f"{name}::{key}" not in keys:
                    raise ValueError(f"{path}: no {key} for parameter {name}")
                self._set_state(p, tensors.get_tensor(f"{name}::{key}").to(torch.float32), key)
        return True

    def _set_state(self, p: torch.nn.Parameter, value: torch.Tensor, key: str) -> None:
        """Put this process's part of the whole ``value`` into ``p``'s optimizer state ``key``."""
        deepspeed = _import_deepspeed()
        if self.zero_stage != 3 or self.ranks is None:
            deepspeed.utils.safe_set_full_optimizer_state(p, value, key)
            return
        # DeepSpeed 0.19's set_full_hp_param cuts past the end of a parameter smaller than the
        # group (the critic head's bias); its partitions are padded, so cut the padded value here.
        part = p.ds_tensor.numel()
        flat = torch.nn.functional.pad(value.reshape(-1), (0, part * self.ranks.size - value.numel()))
        mine = flat[part * self.ranks.rank : part * (self.ranks.rank + 1)]
        deepspeed.utils.safe_set_local_optimizer_state(p, mine.to(p.ds_tensor.device), key)


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
