"""Optimizer state as safetensors, keyed by parameter name (never pickle).

``torch.save`` of an optimizer state dict is a pickle; ac2 stores the tensors with
safetensors and the hyper-parameters as JSON, so a checkpoint resumes exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

TENSORS = "optimizer.safetensors"
GROUPS = "optimizer.json"


def save_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module, folder: Path) -> None:
    names = {id(p): n for n, p in model.named_parameters()}
    sd = optimizer.state_dict()
    index_to_name = {}
    for group_sd, group in zip(sd["param_groups"], optimizer.param_groups):
        for idx, p in zip(group_sd["params"], group["params"]):
            index_to_name[idx] = names[id(p)]
    tensors = {}
    for idx, state in sd["state"].items():
        for key, value in state.items():
            t = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"{index_to_name[idx]}::{key}"] = t.detach().cpu().contiguous()
    save_file(tensors, str(folder / TENSORS))
    groups = [
        {k: v for k, v in g.items() if k != "params"} | {"params": [index_to_name[i] for i in g["params"]]}
        for g in sd["param_groups"]
    ]
    (folder / GROUPS).write_text(json.dumps({"param_groups": groups}, indent=1, sort_keys=True) + "\n")


def load_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module, folder: Path) -> bool:
    """Restore state saved by ``save_optimizer``; False when the folder holds none."""
    if not (folder / TENSORS).exists():
        return False
    tensors = load_file(str(folder / TENSORS))
    names = {id(p): n for n, p in model.named_parameters()}
    sd = optimizer.state_dict()
    name_to_index = {}
    for group_sd, group in zip(sd["param_groups"], optimizer.param_groups):
        for idx, p in zip(group_sd["params"], group["params"]):
            name_to_index[names[id(p)]] = idx
    state: dict[int, dict] = {}
    for key, t in tensors.items():
        name, field = key.rsplit("::", 1)
        if name not in name_to_index:
            raise ValueError(f"{folder / TENSORS}: optimizer state for unknown parameter {name}")
        state.setdefault(name_to_index[name], {})[field] = t
    sd["state"] = state
    optimizer.load_state_dict(sd)
    return True
