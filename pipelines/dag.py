"""The two pipelines, built from the recipe: ``ac2-bootstrap`` (run once) and ``ac2-iteration``
(run once per iteration).

Each stage of ``ac2_core.stages.recipe`` becomes a task of its component, its inputs wired
as the recipe says: an input from this iteration is the output of the task that writes it;
one from the bootstrap or the previous iteration comes in as a pipeline parameter
``<keyword>_uri`` that ``dsl.importer`` turns back into an artifact, so lineage connects
the runs. KFP has no loop over iterations: the kfp runner (``pipelines.local``) and
``ac2 submit`` run one iteration pipeline after another, with the URIs from
``pipelines.driver.pipeline_arguments``.

One DAG serves both algorithms. From the first stage that runs under one algorithm only
(``update_critic``, ac2), the rest is built once per algorithm, inside a branch on the
``algorithm`` the ``config`` task reads from the validated config:

    sample_prefixes -> generate_chunks -> score_chunks -> check_readiness -> update_actor
                                                       \\-> [ac2]  update_critic -> evaluate(critic)
                                                       \\-> [grpo] evaluate()

``evaluate`` sits in both branches because it reads the *updated* critic under ac2, and
KFP forbids consuming a branch's output outside it (``dsl.OneOf`` would join them, but
kfp.local 2.17.3 cannot resolve a OneOf of artifacts). An input that a stage reads only
under a config condition is wired all the same (the recipe's ``read_when``).

On a cluster, the ``cluster`` section of the config (``ac2_core.config.ClusterConfig``)
decides what each task asks Kubernetes for: GPUs, the GPU image, CPU and memory, node
selectors, tolerations, a memory-backed ``/dev/shm``, the S3 credentials Secret and, for
the grading tasks, the rubric judge's API key Secret, all through kfp-kubernetes.
``build_pipelines(cluster)`` applies them at compile time; ``bootstrap_pipeline`` and
``iteration_pipeline`` are built with the defaults, which add nothing (kfp.local would
ignore them anyway).

No ``from __future__ import annotations`` here: KFP reads the real annotations.
"""

import functools
import inspect
import typing

from kfp import dsl, kubernetes
from kfp.dsl import Dataset, Model

from ac2_core.config import AC2Config, ClusterConfig
from ac2_core.stages import recipe
from ac2_core.stages.recipe import BOOTSTRAP_STAGE, ITERATION, Stage
from components.bootstrap import bootstrap
from components.check_readiness import check_readiness
from components.config import config
from components.evaluate import evaluate
from components.generate_chunks import generate_chunks
from components.image import GPU_IMAGE
from components.sample_prefixes import sample_prefixes
from components.score_chunks import score_chunks
from components.update_actor import update_actor
from components.update_critic import update_critic

BOOTSTRAP_PIPELINE = "ac2-bootstrap"
ITERATION_PIPELINE = "ac2-iteration"

COMPONENTS = {
    "bootstrap": bootstrap,
    "sample_prefixes": sample_prefixes,
    "generate_chunks": generate_chunks,
    "score_chunks": score_chunks,
    "check_readiness": check_readiness,
    "update_actor": update_actor,
    "update_critic": update_critic,
    "evaluate": evaluate,
}
ALGORITHMS = typing.get_args(AC2Config.model_fields["algorithm"].annotation)
# the keys of the S3 credentials Secret (k8s/base), each given to the stages as the env variable of its name
S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# the tasks that call the grader, so the only ones that get the judge's API key (cluster.judge_secret)
GRADING_TASKS = ("bootstrap", "score_chunks", "evaluate")
DEFAULT_CLUSTER = ClusterConfig()

# the iteration pipeline's parameters: the config, the iteration, and a URI per input from outside it
ITERATION_PARAMETERS = inspect.Signature(
    [
        inspect.Parameter("config_json", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str),
        inspect.Parameter("iteration", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=int),
        *(
            inspect.Parameter(f"{inp.keyword}_uri", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)
            for inp in recipe.imports()
        ),
    ],
    return_annotation=Model,
)


def _on_cluster(task: dsl.PipelineTask, name: str, cluster: ClusterConfig, judge_key_env: str | None = None) -> dsl.PipelineTask:
    """Put ``cluster``'s Kubernetes settings for the task ``name`` on it; the defaults add none.

    ``judge_key_env`` is ``task.judge.api_key_env``: the env variable that the grading tasks
    get ``cluster.judge_secret`` as (the config's validator makes sure it is set then)."""
    gpu = cluster.gpu if name in cluster.gpu.stages else None
    resources = cluster.tasks if gpu is None else gpu
    for set_resource, value in (
        (task.set_cpu_request, resources.cpu_request),
        (task.set_cpu_limit, resources.cpu_limit),
        (task.set_memory_request, resources.memory_request),
        (task.set_memory_limit, resources.memory_limit),
    ):
        if value is not None:
            set_resource(value)
    if name != "config":  # every stage may read model or task data from object storage; config reads nothing
        if cluster.s3_secret:
            kubernetes.use_secret_as_env(task, secret_name=cluster.s3_secret, secret_key_to_env={k: k for k in S3_SECRET_KEYS})
        if cluster.s3_endpoint_url:
            task.set_env_variable("AWS_ENDPOINT_URL_S3", cluster.s3_endpoint_url)
    if name in GRADING_TASKS and cluster.judge_secret:
        if not judge_key_env:
            raise ValueError("cluster.judge_secret needs task.judge.api_key_env, the env variable to put the key in")
        judge = cluster.judge_secret
        kubernetes.use_secret_as_env(task, secret_name=judge.name, secret_key_to_env={judge.key: judge_key_env})
    if gpu is None:
        return task
    if gpu.accelerator_count:
        task.set_accelerator_type(gpu.accelerator_type).set_accelerator_limit(gpu.accelerator_count)
        task.set_container_image(GPU_IMAGE)
    for key, value in gpu.node_selector:
        kubernetes.add_node_selector(task, label_key=key, label_value=value)
    for t in gpu.tolerations:
        kubernetes.add_toleration(task, key=t.key, operator=t.operator, value=t.value, effect=t.effect)
    if gpu.shm_size:
        # the container runtime's /dev/shm is 64Mi; NCCL and data-loader workers need far more
        kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory", size_limit=gpu.shm_size)
    return task


def _config_task(config_json, cluster: ClusterConfig) -> dsl.PipelineTask:
    return _on_cluster(config(config_json=config_json).set_display_name("config"), "config", cluster)


def _import(uri, inp: recipe.Input) -> dsl.PipelineTask:
    cls = Model if inp.artifact in recipe.MODELS else Dataset
    return dsl.importer(artifact_uri=uri, artifact_class=cls, reimport=False).set_display_name(f"import {inp.keyword}")


def build_pipelines(cluster: ClusterConfig = DEFAULT_CLUSTER, judge_key_env: str | None = None) -> dict:
    """Both pipelines, ``{"bootstrap": ..., "iteration": ...}``, with ``cluster``'s settings on their tasks
    (``judge_key_env``: ``task.judge.api_key_env``, needed with ``cluster.judge_secret``)."""
    on_cluster = functools.partial(_on_cluster, cluster=cluster, judge_key_env=judge_key_env)

    def add(stage: Stage, wired: dict) -> dsl.PipelineTask:
        # stochastic stages must never be served from a cache
        task = COMPONENTS[stage.name](**wired).set_display_name(stage.name).set_caching_options(False)
        return on_cluster(task, stage.name)

    def bootstrap_pipeline(config_json: str) -> Model:
        setup = _config_task(config_json, cluster)
        return add(BOOTSTRAP_STAGE, {"config": setup.outputs["config"]}).outputs["out_actor"]

    def iteration_pipeline(*values):
        args = dict(zip(ITERATION_PARAMETERS.parameters, values))
        setup = _config_task(args["config_json"], cluster)
        common = {"config": setup.outputs["config"], "iteration": args["iteration"]}
        imported = {inp.keyword: _import(args[f"{inp.keyword}_uri"], inp).output for inp in recipe.imports()}
        split = next(i for i, s in enumerate(ITERATION) if s.only_for is not None)
        (branch,) = {s.only_for for s in ITERATION[split:] if s.only_for is not None}
        produced = _add_stages(add, ITERATION[:split], None, common, imported, {})
        with dsl.If(setup.outputs["algorithm"] == branch, name=branch):
            _add_stages(add, ITERATION[split:], branch, common, imported, produced)
        with dsl.Else(name=" ".join(a for a in ALGORITHMS if a != branch)):
            _add_stages(add, ITERATION[split:], None, common, imported, produced)
        return produced["actor"]

    iteration_pipeline.__signature__ = ITERATION_PARAMETERS  # KFP reads the parameters from the signature
    return {
        "bootstrap": dsl.pipeline(
            name=BOOTSTRAP_PIPELINE,
            description="AC2 bootstrap: problems, initial actor and critic, empty iteration-0 tables",
        )(bootstrap_pipeline),
        "iteration": dsl.pipeline(
            name=ITERATION_PIPELINE,
            description="One AC2 (or GRPO) iteration over the previous iteration's artifacts",
        )(iteration_pipeline),
    }


def _add_stages(add, stages, algorithm: str | None, common: dict, imported: dict, produced: dict) -> dict:
    """Add the tasks of ``stages`` that run under ``algorithm`` (None: only those that run under
    every algorithm), each input wired to an import or to the task that writes it in this iteration;
    an input whose writer is not among them is left out (the stage takes it as None).
    Returns the artifacts produced so far: ``produced`` and these tasks' outputs."""
    produced = dict(produced)
    for stage in stages:
        if stage.only_for not in (None, algorithm):
            continue
        wired = {
            inp.keyword: imported[inp.keyword] if inp.imported else produced[inp.artifact]
            for inp in stage.inputs
            if inp.imported or inp.artifact in produced
        }
        task = add(stage, {**common, **wired})
        produced.update({name: task.outputs[f"out_{name}"] for name in stage.outputs})
    return produced


# with the default (empty) cluster settings: what kfp.local runs
_DEFAULT = build_pipelines()
bootstrap_pipeline, iteration_pipeline = _DEFAULT["bootstrap"], _DEFAULT["iteration"]
