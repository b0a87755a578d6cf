"""Save and load HF model directories: safetensors weights, config and tokenizer.

ac2 never loads pickle: a directory whose weights exist only as ``*.bin``/``*.pt``
files is refused before transformers touches it, since unpickling runs arbitrary code.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from ac2_core.models.tokenizer import load_tokenizer  # torch-free, so ModelStore.tokenizer stays light
from ac2_core.storage import PICKLE_SUFFIXES  # one list of refused formats

__all__ = ["ATTN_IMPLEMENTATION", "ModelFormatError", "check_safetensors_dir", "load_model", "load_tokenizer", "save_model"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# Eager attention by default, because batch composition should change a row's numbers
# as little as possible (log-probs at generation and at training time should agree).
# With explicit position ids, a left-padded row matched the same row alone bit for bit
# in 15 of 20 random batches under eager and in 1 of 20 under sdpa; the rest differed
# by at most 5e-7 on logits (float32 matmuls of other shapes). Speed was the same on
# the tiny model. HF does not save this choice in config.json, so loaders pass it
# again. Long-context GPU runs may prefer "sdpa" (eager materialises T x T scores).
ATTN_IMPLEMENTATION = "eager"

hf_logging.disable_progress_bar()  # per-file progress bars of tiny checkpoints drown the training log


class ModelFormatError(ValueError):
    """A model directory that ac2 will not load (no safetensors weights)."""


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype: expected one of {', '.join(_DTYPES)}, found {name!r}") from None


def check_safetensors_dir(path: str | Path, *, ignore: tuple[str, ...] = ()) -> Path:
    """Return ``path`` if it holds ``*.safetensors`` weights (other than ``ignore``); else raise.

    FileNotFoundError if it is not a directory; ModelFormatError naming the directory
    and the pickle-format files in it if it has no safetensors weights.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist or is not a directory")
    files = sorted(p.name for p in path.iterdir() if p.is_file())
    if any(name.endswith(".safetensors") and name not in ignore for name in files):
        return path
    pickles = [name for name in files if name.endswith(PICKLE_SUFFIXES)]
    found = f"found only pickle-format files: {', '.join(pickles)}" if pickles else "found no weights at all"
    raise ModelFormatError(
        f"model directory {path} has no *.safetensors weights ({found}); "
        "ac2 never loads pickle, convert the checkpoint to safetensors first"
    )


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """Write ``model`` (safetensors) and ``tokenizer`` to the directory ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)  # transformers 5 writes safetensors only
    tokenizer.save_pretrained(path)
    check_safetensors_dir(path)
    return path


def load_model(
    path: str | Path,
    *,
    dtype: str = "float32",
    trust_remote_code: bool = False,
    attn_implementation: str = ATTN_IMPLEMENTATION,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a local HF directory, in eval mode."""
    path = check_safetensors_dir(path)
    model = from_local(
        AutoModelForCausalLM, path, dtype=dtype, trust_remote_code=trust_remote_code, attn_implementation=attn_implementation
    )
    return model.eval(), load_tokenizer(path)


def from_local(auto_class, path: Path, *, dtype: str, trust_remote_code: bool, attn_implementation: str) -> PreTrainedModel:
    """``auto_class.from_pretrained`` the one way ac2 allows: local files, safetensors only."""
    return auto_class.from_pretrained(
        path,
        dtype=torch_dtype(dtype),
        local_files_only=True,
        use_safetensors=True,
        trust_remote_code=trust_remote_code,
        attn_implementation=attn_implementation,
    )
