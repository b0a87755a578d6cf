"""Compile the pipelines to KFP IR YAML, with the validated config as ``config_json``'s default."""

from __future__ import annotations

from pathlib import Path

from ac2_core.config import AC2Config

PIPELINES = ("iteration", "bootstrap")


def pipeline_func(which: str):
    from pipelines.dag import bootstrap_pipeline, iteration_pipeline

    match which:
        case "iteration":
            return iteration_pipeline
        case "bootstrap":
            return bootstrap_pipeline
        case _:
            raise ValueError(f"pipeline must be one of {', '.join(PIPELINES)}; found {which!r}")


def compile_pipeline(cfg: AC2Config, out: str | Path, which: str = "iteration") -> Path:
    """Write the ``which`` pipeline's IR YAML to ``out``; returns the path."""
    from kfp import compiler

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(pipeline_func(which), str(out), pipeline_parameters={"config_json": cfg.to_json()})
    return out
