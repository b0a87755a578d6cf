"""bootstrap: the problem set, the initial actor and critic, and the empty iteration-0 tables."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def bootstrap(
    config: Input[Artifact],
    out_problems: Output[Dataset],
    out_actor: Output[Model],
    out_critic: Output[Model],
    out_replay: Output[Dataset],
    out_scored_chunks: Output[Dataset],
    out_readiness: Output[Dataset],
    out_metrics: Output[Dataset],
):
    from components.io import run_stage

    run_stage("bootstrap", locals())
