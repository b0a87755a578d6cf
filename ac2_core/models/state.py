"""A checkpoint's ``ac2_state.json``: its kind, version, trained tokens and the statistics of
the update that wrote it (``stats``: means over its optimizer steps, absent from a bootstrap).

Torch-free on purpose: ``sample_prefixes`` and ``evaluate`` read a version without
importing torch or transformers, which costs seconds in every fresh KFP task.
"""

from __future__ import annotations

import json
import math

from ac2_core import storage

STATE = "ac2_state.json"


def read_state(uri: str, *, kind: str) -> dict:
    """A published checkpoint's state (version, trained tokens), without its weights."""
    manifest = storage.read_manifest(uri)
    if manifest.kind != kind:
        raise storage.ArtifactError(f"{uri}: expected a {kind} checkpoint, found a {manifest.kind} artifact")
    return json.loads(storage.read_file(uri, STATE))


def read_version(uri: str, *, kind: str) -> int:
    return int(read_state(uri, kind=kind)["version"])


def update_stats(history: list[dict], keys: dict[str, str]) -> dict:
    """The means over an update's optimizer steps (``history``: one dict of figures per step) of
    the figures ``keys`` names (figure -> name in the state); None each when no step was taken."""
    out = {}
    for figure, name in sorted(keys.items()):
        mean = sum(h[figure] for h in history) / len(history) if history else None
        out[name] = mean if mean is None or math.isfinite(mean) else None  # JSON has no NaN
    return out
