"""A checkpoint's ``ac2_state.json``: its kind, version and trained tokens.

Torch-free on purpose: ``sample_prefixes`` and ``evaluate`` read a version without
importing torch or transformers, which costs seconds in every fresh KFP task.
"""

from __future__ import annotations

import json

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
