"""bootstrap: the problem set, the initial actor and critic, and the empty iteration-0 tables."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def bootstrap(
    config: Input[Artifact],
    problems: Output[Dataset],
    actor: Output[Model],
    critic: Output[Model],
    replay: Output[Dataset],
    scored_chunks: Output[Dataset],
    readiness: Output[Dataset],
    metrics: Output[Dataset],
):
    """Calls ``ac2_core.stages.bootstrap.bootstrap``; ``replay`` .. ``metrics`` are ``EMPTY_STATE``."""
    from components.io import run_stage

    run_stage(
        "ac2_core.stages.bootstrap:bootstrap",
        config,
        outputs=(problems, actor, critic, replay, scored_chunks, readiness, metrics),
        problems=problems.path,
        actor=actor.path,
        critic=critic.path,
        state={"replay": replay.path, "scored_chunks": scored_chunks.path, "readiness": readiness.path, "metrics": metrics.path},
    )
