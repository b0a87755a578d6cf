"""score_chunks: rewards, critic values, and the critic's out-of-sample (prediction, outcome) pairs."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def score_chunks(
    config: Input[Artifact],
    iteration: int,
    problems: Input[Dataset],
    replay: Input[Dataset],
    prefixes: Input[Dataset],
    chunks: Input[Dataset],
    actor: Input[Model],
    critic: Input[Model],
    out_scored_chunks: Output[Dataset],
    out_critic_pairs: Output[Dataset],
):
    """``critic`` is read only when the config's algorithm uses one (ac2)."""
    from components.io import run_stage

    run_stage("score_chunks", locals())
