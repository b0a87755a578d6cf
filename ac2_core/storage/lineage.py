"""What an artifact was made from: the inputs of the stage that wrote it, named in its manifest.

``recording(iteration, inputs)`` opens a block in which every artifact published
(``publish_dir``) carries, in its manifest's optional ``lineage`` field, the iteration and
each input's URI and content hash::

    "lineage": {"iteration": 2, "inputs": {"actor": {"uri": "iter-0001/update_actor/actor",
                                                      "content_hash": "3f0c..."}, ...}}

``recipe.run_stage`` opens it around every stage call. The runners name each input by its
path in the run folder (``RunLayout.relative``), so a run folder can be moved or copied to
object storage and its manifests still point inside it, and both runners write the same
manifests; ``ac2 stage`` names the URIs it was given. Like ``using``, the block is a
context variable: nothing outlives it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_current: contextvars.ContextVar[dict | None] = contextvars.ContextVar("ac2_lineage", default=None)


@contextlib.contextmanager
def recording(iteration: int, inputs: dict[str, tuple[str, str]]) -> Iterator[dict]:
    """Record ``inputs`` (keyword -> (URI to name, URI to read its manifest at)) in every
    manifest published in this block. The content hashes are read once, here, before the
    stage runs: a missing input fails now, naming its URI."""
    from ac2_core.storage.artifacts import read_manifest

    record = {
        "iteration": iteration,
        "inputs": {
            keyword: {"uri": named, "content_hash": read_manifest(actual).content_hash}
            for keyword, (named, actual) in sorted(inputs.items())
        },
    }
    token = _current.set(record)
    try:
        yield record
    finally:
        _current.reset(token)


def current() -> dict | None:
    """The lineage of the innermost ``recording`` block, or None outside one."""
    return _current.get()
