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
    from components.io import log_figures, run_stage, write_report

    row = run_stage(
        "ac2_core.stages.evaluate:run",
        config,
        outputs=(out_metrics,),
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
    log_figures(figures, row)
    write_report(report, out_metrics.path)
