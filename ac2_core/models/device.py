"""Where models run: ``model.device`` (auto, cpu or cuda) resolved on this machine.

The config cannot check CUDA when it is validated: it is validated where a run is
submitted, and one config serves a pipeline's GPU and CPU tasks. So the choice is
resolved where the models load, and ``cuda`` on a machine without it is an error that
names the field, raised before any weights are read.
"""

from __future__ import annotations

import os

import torch

from ac2_core.config import ConfigError


def resolve_device(choice: str) -> torch.device:
    """``auto``: cuda when this machine has it, else cpu. ConfigError for cuda without CUDA."""
    match choice:
        case "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        case "cpu":
            return torch.device("cpu")
        case "cuda":
            if not torch.cuda.is_available():
                raise ConfigError(f"model.device is 'cuda' but {_why_no_cuda()}; set model.device to auto or cpu")
            return torch.device("cuda")
        case other:
            raise ConfigError(f"model.device: expected auto, cpu or cuda, found {other!r}")


def _why_no_cuda() -> str:
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is built without CUDA"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    return f"this torch (CUDA {torch.version.cuda}) sees no GPU (CUDA_VISIBLE_DEVICES={visible})"


def device_of(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s first parameter: where the tensors it is fed must be."""
    return next(model.parameters()).device


def visible_gpus(choice: str) -> int:
    """GPUs a stage that places its models by ``choice`` (``model.device``) can use on this machine; 0 on CPU."""
    return torch.cuda.device_count() if resolve_device(choice).type == "cuda" else 0
