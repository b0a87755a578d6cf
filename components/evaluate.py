"""evaluate: validation score and the compute bill; appends one row to the metrics table."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate(
    config: Input[Artifact],
    iteration: int,
    problems: Input[Dataset],
    actor: Input[Model],
    prefixes: Input[Dataset],
    chunks: Input[Dataset],
    scored_chunks: Input[Dataset],
    critic_pairs: Input[Dataset],
    readiness: Input[Dataset],
    metrics: Input[Dataset],
    out_metrics: Output[Dataset],
    figures: Output[Metrics],
    report: Output[Markdown],
    critic: Input[Model] = None,
):
    """``critic`` is this iteration's updated critic (ac2), absent for grpo."""
    from ac2_core.stages import evaluate
    from components.io import annotate, log_figures, stage_context, write_report

    with stage_context(config) as (cfg, clock):
        row = evaluate.run(
            cfg,
            iteration=iteration,
            problems=problems.path,
            actor=actor.path,
            prefixes=prefixes.path,
            chunks=chunks.path,
            scored_chunks=scored_chunks.path,
            critic_pairs=critic_pairs.path,
            readiness=readiness.path,
            critic=critic.path if critic else None,
            metrics=metrics.path,
            out_metrics=out_metrics.path,
        )
        annotate(row, clock(), out_metrics)
        log_figures(figures, row)
        write_report(report, out_metrics.path)
