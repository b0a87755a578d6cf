"""Compile the pipelines to KFP IR YAML, with the validated config as ``config_json``'s default."""

from __future__ import annotations

from pathlib import Path

from ac2_core.config import AC2Config, ClusterConfig

PIPELINES = ("iteration", "bootstrap")


def pipeline_func(which: str, cluster: ClusterConfig | None = None, judge_key_env: str | None = None):
    """The ``which`` pipeline, with ``cluster``'s Kubernetes settings on its tasks (default: none);
    ``judge_key_env`` is ``task.judge.api_key_env``, the variable ``cluster.judge_secret`` fills."""
    from pipelines.dag import build_pipelines

    if which not in PIPELINES:
        raise ValueError(f"pipeline must be one of {', '.join(PIPELINES)}; found {which!r}")
    return build_pipelines(cluster or ClusterConfig(), judge_key_env)[which]


def compile_pipeline(cfg: AC2Config, out: str | Path, which: str = "iteration") -> Path:
    """Write the ``which`` pipeline's IR YAML to ``out``; returns the path."""
    from kfp import compiler

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    judge_key_env = cfg.task.judge.api_key_env if cfg.task.judge else None
    func = pipeline_func(which, cfg.cluster, judge_key_env)
    compiler.Compiler().compile(func, str(out), pipeline_parameters={"config_json": cfg.to_json()})
    return out
