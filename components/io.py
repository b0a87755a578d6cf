"""What every component body shares: running its stage on the config artifact's config, and
annotating the outputs.

Imported inside component bodies, in the task's process: keep it light. With a warm task
host, a task imports kfp's executor, this module and ``pipelines.taskhost``, and nothing
beyond the standard library (0.05 s).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

CONFIG_FILE = "config.json"


def run_stage(target: str, config, outputs: tuple = (), **kwargs) -> dict:
    """Run ``target`` ("module:function", called as ``function(cfg, **kwargs)`` with the
    config artifact's config) and annotate ``outputs`` with its figures; returns them.

    Under ``ac2 run`` on this machine a warm task host runs the call in a worker forked from
    a process that has the stage code imported (``pipelines.taskhost``); anywhere else, or
    if that host is gone, the call runs in this task's process. The artifacts are the same.
    """
    from pipelines import taskhost

    config_path = str(Path(config.path, CONFIG_FILE))
    paths = [artifact.path for artifact in outputs]
    result = None
    if address := os.environ.get(taskhost.ENV):
        try:
            result = taskhost.call(target, config_path, kwargs, paths, address=address)
        except taskhost.HostUnavailable as e:
            print(f"ac2: {e}; running {target} in the task's own process", file=sys.stderr, flush=True)
    if result is None:
        result = taskhost.execute(target, config_path, kwargs, paths)
    for artifact in outputs:
        artifact.metadata.update({k: _scalar(v) for k, v in result.stats.items()})
        artifact.metadata.update({**result.manifests[artifact.path], "stage_seconds": round(result.seconds, 3)})
    return result.stats


def _scalar(value):
    # KFP metadata is a protobuf Struct: no NaN, no nested objects
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def log_figures(metrics, row: dict) -> None:
    """The iteration's headline numbers as KFP metrics (a ``system.Metrics`` artifact)."""
    for key, value in row.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            metrics.log_metric(key, value)


def write_report(markdown, metrics_uri: str) -> None:
    """The learning curve so far, as a Markdown table (a ``system.Markdown`` artifact)."""
    from ac2_core import storage
    from ac2_core.runner.report import metrics_markdown

    Path(markdown.path).parent.mkdir(parents=True, exist_ok=True)
    Path(markdown.path).write_text(metrics_markdown(storage.read_rows(metrics_uri, kind="metrics")) + "\n")
