"""A checkpoint's ``ac2_state.json``: its kind, version, trained tokens and the statistics of
the update that wrote it (``stats``: means over its optimizer steps, absent from a bootstrap).

Torch-free on purpose: ``sample_prefixes`` and ``evaluate`` read a version without
importing torch or transformers, which costs seconds in every fresh KFP task.

``loading`` is how every load of a model directory reports a failure: files that match
their manifest can still be damaged (a truncated safetensors file, a ``config.json``
that is not JSON, with the manifest rewritten to match), and whatever transformers,
safetensors or tokenizers raise then becomes one ``ArtifactError`` naming the URI.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator

from ac2_core import storage

STATE = "ac2_state.json"


@contextlib.contextmanager
def loading(uri: str, what: str) -> Iterator[None]:
    """Any error of the block, a failure to load ``what`` (``this actor model directory``) of the
    artifact at ``uri``, as an ArtifactError naming it."""
    try:
        yield
    except (storage.ArtifactError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - safetensors, transformers and tokenizers each raise their own
        raise storage.ArtifactError(f"{uri}: cannot load {what} ({type(e).__name__}: {e})") from e


def parse_state(uri: str, data: bytes) -> dict:
    """``ac2_state.json``'s fields, checked: ``version`` and ``trained_tokens`` non-negative integers."""
    try:
        state = json.loads(data)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise storage.ArtifactError(f"{uri}: {STATE} is not JSON ({e})") from None
    for key in ("version", "trained_tokens"):
        value = state.get(key) if isinstance(state, dict) else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise storage.ArtifactError(f"{uri}: {STATE}: {key} should be a non-negative integer, found {value!r}")
    return state


def read_state(uri: str, *, kind: str) -> dict:
    """A published checkpoint's state (version, trained tokens), without its weights."""
    manifest = storage.read_manifest(uri)
    if manifest.kind != kind:
        raise storage.ArtifactError(f"{uri}: expected a {kind} checkpoint, found a {manifest.kind} artifact")
    return parse_state(uri, storage.read_file(uri, STATE))


def read_version(uri: str, *, kind: str) -> int:
    return read_state(uri, kind=kind)["version"]


def update_stats(history: list[dict], keys: dict[str, str]) -> dict:
    """The means over an update's optimizer steps (``history``: one dict of figures per step) of
    the figures ``keys`` names (figure -> name in the state); None each when no step was taken."""
    out = {}
    for figure, name in sorted(keys.items()):
        mean = sum(h[figure] for h in history) / len(history) if history else None
        out[name] = mean if mean is None or math.isfinite(mean) else None  # JSON has no NaN
    return out
