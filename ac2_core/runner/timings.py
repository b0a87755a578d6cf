"""Wall-clock seconds per stage of each iteration: ``<run>/timings.json``.

Kept out of the artifacts on purpose: the metrics table must be byte-identical when an
iteration is rerun, and seconds never are. The console, ``summary.md``, ``ac2 report`` and
the trackers show them from here.
"""

from __future__ import annotations

import json

from ac2_core import storage

TIMINGS = "timings.json"


def read_timings(root: str) -> dict[int, dict[str, float]]:
    """Iteration -> stage -> seconds, for the iterations timed so far ({} where none were)."""
    text = storage.read_text(storage.join(root, TIMINGS))
    return {int(k): v for k, v in json.loads(text).items()} if text else {}


def add_timing(root: str, iteration: int, seconds: dict[str, float]) -> None:
    timings = read_timings(root) | {iteration: {k: round(v, 3) for k, v in seconds.items()}}
    storage.write_text(storage.join(root, TIMINGS), json.dumps({str(k): timings[k] for k in sorted(timings)}, indent=1) + "\n")
