"""What every component body shares: running its stage on the config artifact's config, and
annotating the outputs.

Imported inside component bodies, in the task's process: keep it light (no torch).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from ac2_core import storage

CONFIG_FILE = "config.json"


def run_stage(target: str, config, outputs: tuple = (), **kwargs) -> dict:
    """Run ``target`` ("module:function", called as ``function(cfg, **kwargs)`` with the
    config artifact's config) and annotate ``outputs`` with its figures; returns them.

    Under ``ac2 run`` on this machine a warm task host runs the call in a worker forked from
    a process that has the stage code imported (``pipelines.taskhost``); anywhere else, or
    if that host is gone, the call runs in this task's process. The artifacts are the same.
    """
    config_path = str(Path(config.path, CONFIG_FILE))
    address = os.environ.get("AC2_TASK_HOST")
    stats = None
    if address:
        from pipelines import taskhost

        try:
            stats, seconds = taskhost.call(target, config_path, kwargs, address=address)
        except taskhost.HostUnavailable as e:
            print(f"ac2: {e}; running {target} in the task's own process", file=sys.stderr, flush=True)
    if stats is None:
        from pipelines.taskhost import execute

        stats, seconds = execute(target, config_path, kwargs)
    annotate(stats, seconds, *outputs)
    return stats


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
