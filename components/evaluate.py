"""evaluate: validation score, training statistics and the compute bill; appends one row to the
metrics table, keeps a few decoded samples, and shows both in the KFP UI."""

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
    out_samples: Output[Dataset],
    out_metrics: Output[Dataset],
    figures: Output[Metrics],
    report: Output[Markdown],
    critic: Input[Model] = None,
):
    """``critic`` is this iteration's updated critic (ac2), absent for grpo."""
    from components.io import log_figures, run_stage, write_report

    row = run_stage("evaluate", locals())
    log_figures(figures, row)
    write_report(report, out_metrics.path, out_samples.path)
