"""What every component body shares: running its stage on the config artifact's config, and
annotating the outputs.

A component declares its stage's inputs and outputs as KFP artifacts, in the recipe's
names (``ac2_core.stages.recipe``), and passes its parameters here as ``locals()``:

    run_stage("generate_chunks", locals())

Imported inside component bodies, in the task's process: keep it light. With a warm task
host, a task imports kfp's executor, this module, ``components.taskhost`` and the recipe,
and nothing beyond the standard library (0.05 s).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from components.taskhost import call_or_run

CONFIG_FILE = "config.json"


def run_stage(name: str, params: dict) -> dict:
    """Run stage ``name`` on a component's parameters: ``config`` (the config artifact),
    ``iteration`` (absent for the bootstrap), and an artifact for each input and ``out_``
    output the recipe names. Annotates each output with the stage's figures and its
    manifest; returns the figures.

    Under ``ac2 run`` on this machine a warm task host runs the call in a worker forked from
    a process that has the stage code imported (``components.taskhost``); anywhere else, or
    if that host is gone, the call runs in this task's process. The artifacts are the same.
    """
    from ac2_core.stages.recipe import MODELS, stage

    s = stage(name)
    missing = [k for k in ("config", *(i.keyword for i in s.inputs), *s.out_keywords) if k not in params]
    if missing:
        raise TypeError(f"component {name} has no parameter {', '.join(missing)}, which the recipe names")
    inputs = {i.keyword: params[i.keyword].path if params[i.keyword] is not None else None for i in s.inputs}
    outputs = [params[k] for k in s.out_keywords]
    call = dict(
        stage=name,
        iteration=params.get("iteration", 0),
        config_path=str(Path(params["config"].path, CONFIG_FILE)),
        kwargs={**inputs, **{k: artifact.path for k, artifact in zip(s.out_keywords, outputs)}},
        outputs=[artifact.path for artifact in outputs],
    )
    # models the stage reads: a warm task host loads them before it forks the worker, and keeps them for later tasks
    models = [[inputs[i.keyword], i.artifact] for i in s.inputs if s.models and i.artifact in MODELS and inputs[i.keyword]]
    preload = {"config_path": call["config_path"], "models": models} if models else None
    result = call_or_run(execute_stage, call, label=f"stage {name}", preload=preload)
    for artifact in outputs:
        artifact.metadata.update({k: _scalar(v) for k, v in result["stats"].items()})
        artifact.metadata.update({**result["manifests"][artifact.path], "stage_seconds": round(result["seconds"], 3)})
    return result["stats"]


def execute_stage(*, stage: str, iteration: int, config_path: str, kwargs: dict, outputs: list[str], models=None) -> dict:
    """Run the stage on the config file's config, with its storage settings in effect; return
    its figures, its seconds, and each output's manifest figures (for the KFP metadata).

    Run by a task host's worker, or by the task itself where there is no host. ``models``:
    the host's ``LoadedModels``, which the stage's store takes its checkpoints from.
    """
    from ac2_core import storage
    from ac2_core.config import config_from_json
    from ac2_core.runner.layout import RunLayout
    from ac2_core.stages.recipe import calls
    from ac2_core.stages.recipe import run_stage as call_stage

    cfg = config_from_json(Path(config_path).read_text())
    # the manifests name each input by its place in a run folder, as the inprocess runner's do
    named = next(c.kwargs for c in calls(cfg, iteration, RunLayout.relative) if c.stage == stage)
    with storage.using(cfg.storage):
        start = time.perf_counter()
        store = None
        if models is not None:
            from ac2_core.models.store import ModelStore

            store = ModelStore(cfg, loaded=models)
        stats = call_stage(cfg, stage, iteration=iteration, kwargs=kwargs, store=store, named=named)
        seconds = time.perf_counter() - start
        manifests = {uri: _manifest_figures(storage.read_manifest(uri)) for uri in outputs}
    return {"stats": stats.as_dict(), "seconds": seconds, "manifests": manifests}


def _manifest_figures(m) -> dict:
    return {"kind": m.kind, "stage": m.stage, "rows": m.rows, "content_hash": m.content_hash, "config_hash": m.config_hash}


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


def write_report(markdown, metrics_uri: str, samples_uri: str) -> None:
    """The learning curve so far as a Markdown table, and the iteration's decoded samples (a
    ``system.Markdown`` artifact)."""
    from ac2_core import storage
    from ac2_core.runner.report import metrics_markdown, samples_markdown

    samples = storage.read_rows(samples_uri, kind="samples")
    text = metrics_markdown(storage.read_rows(metrics_uri, kind="metrics"))
    text += "\n\n## Samples of this iteration\n\n" + samples_markdown(samples) + "\n"
    Path(markdown.path).parent.mkdir(parents=True, exist_ok=True)
    Path(markdown.path).write_text(text)
