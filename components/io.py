"""What every component body shares: reading the config artifact and annotating outputs.

Imported inside component bodies, in the task's process: keep it light (no torch).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path

from ac2_core import storage
from ac2_core.config import AC2Config, config_from_json

CONFIG_FILE = "config.json"


def config_of(artifact) -> AC2Config:
    """The validated config carried by the ``config`` component's output artifact."""
    return config_from_json(Path(artifact.path, CONFIG_FILE).read_text())


@contextlib.contextmanager
def stage_context(artifact) -> Iterator[tuple[AC2Config, Clock]]:
    """The config, with its storage settings in effect (as ``inprocess.run`` does), and a clock."""
    cfg = config_of(artifact)
    with storage.using(cfg.storage):
        yield cfg, Clock()


class Clock:
    """Seconds since the stage's work began (recorded as ``stage_seconds``)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start


def _scalar(value):
    # KFP metadata is a protobuf Struct: no NaN, no nested objects
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def annotate(stats: dict, seconds: float, *outputs) -> None:
    """Copy each output's manifest (kind, rows, hash) and the stage's metrics into its metadata."""
    for artifact in outputs:
        manifest = storage.read_manifest(artifact.path)
        artifact.metadata.update({k: _scalar(v) for k, v in stats.items()})
        artifact.metadata.update(
            {
                "kind": manifest.kind,
                "stage": manifest.stage,
                "rows": manifest.rows,
                "content_hash": manifest.content_hash,
                "config_hash": manifest.config_hash,
                "stage_seconds": round(seconds, 3),
            }
        )


def log_figures(metrics, row: dict) -> None:
    """The iteration's headline numbers as KFP metrics (a ``system.Metrics`` artifact)."""
    for key, value in row.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            metrics.log_metric(key, value)


def write_report(markdown, metrics_uri: str) -> None:
    """The learning curve so far, as a Markdown table (a ``system.Markdown`` artifact)."""
    from components.report import metrics_markdown

    Path(markdown.path).parent.mkdir(parents=True, exist_ok=True)
    Path(markdown.path).write_text(metrics_markdown(storage.read_rows(metrics_uri, kind="metrics")) + "\n")
