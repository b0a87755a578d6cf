"""The two pipelines: ``ac2-bootstrap`` (run once) and ``ac2-iteration`` (run once per iteration).

KFP has no loop over iterations, so the driver (``pipelines.driver``) submits one
iteration run after another and passes the previous run's output URIs in as parameters;
``dsl.importer`` turns them back into artifacts, so lineage connects the runs.

One DAG serves both algorithms, branching on the ``algorithm`` that the ``config`` step
reads from the validated config (so it cannot disagree with the config):

    sample_prefixes -> generate_chunks -> score_chunks -> check_readiness -> update_actor
                                                       \\-> [ac2]  update_critic -> evaluate(critic)
                                                       \\-> [grpo] evaluate()

``evaluate`` sits in both branches because it needs the *updated* critic under ac2, and
KFP forbids consuming a branch's output outside it (``dsl.OneOf`` would join them, but
kfp.local 2.17.3 cannot resolve a OneOf of artifacts). Inputs that a stage reads only
under a config condition are wired unconditionally: ``score_chunks`` always gets the
previous critic (for grpo, the bootstrap critic, which it does not read) and
``update_actor`` always gets the bootstrap actor as ``reference`` (read only when
``actor.kl_beta > 0``). This mirrors ``ac2_core.runner.inprocess.stage_calls``.

On a cluster, the ``cluster`` section of the config (``ac2_core.config.ClusterConfig``)
decides what each task asks Kubernetes for: GPUs, the GPU image, CPU and memory, node
selectors, tolerations, a memory-backed ``/dev/shm``, the S3 credentials Secret and, for
the grading tasks, the rubric judge's API key Secret, all through kfp-kubernetes.
``build_pipelines(cluster)`` applies them at compile time; ``bootstrap_pipeline`` and
``iteration_pipeline`` are built with the defaults, which add
nothing (kfp.local would ignore them anyway).

No ``from __future__ import annotations`` here: KFP reads the real annotations.
"""

import functools

from kfp import dsl, kubernetes
from kfp.dsl import Dataset, Model

from ac2_core.config import ClusterConfig
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

ARTIFACT_CLASS = {"actor": Model, "critic": Model, "reference": Model}
# the keys of the S3 credentials Secret (k8s/base), each given to the stages as the env variable of its name
S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# the tasks that call the grader, so the only ones that get the judge's API key (cluster.judge_secret)
GRADING_TASKS = ("bootstrap", "score_chunks", "evaluate")
DEFAULT_CLUSTER = ClusterConfig()


def _stage(component, name: str, cluster: ClusterConfig, judge_key_env: str | None, **inputs) -> dsl.PipelineTask:
    # stochastic stages must never be served from a cache
    task = component(**inputs).set_display_name(name).set_caching_options(False)
    return _on_cluster(task, name, cluster, judge_key_env)


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


def _import(uri: str, name: str) -> dsl.PipelineTask:
    cls = ARTIFACT_CLASS.get(name, Dataset)
    return dsl.importer(artifact_uri=uri, artifact_class=cls, reimport=False).set_display_name(f"import {name}")


def build_pipelines(cluster: ClusterConfig = DEFAULT_CLUSTER, judge_key_env: str | None = None) -> dict:
    """Both pipelines, ``{"bootstrap": ..., "iteration": ...}``, with ``cluster``'s settings on their tasks
    (``judge_key_env``: ``task.judge.api_key_env``, needed with ``cluster.judge_secret``)."""
    stage = functools.partial(_stage, cluster=cluster, judge_key_env=judge_key_env)

    @dsl.pipeline(
        name=BOOTSTRAP_PIPELINE, description="AC2 bootstrap: problems, initial actor and critic, empty iteration-0 tables"
    )
    def bootstrap_pipeline(config_json: str) -> Model:
        setup = _on_cluster(config(config_json=config_json).set_display_name("config"), "config", cluster)
        boot = stage(bootstrap, "bootstrap", config=setup.outputs["config"])
        return boot.outputs["actor"]

    @dsl.pipeline(name=ITERATION_PIPELINE, description="One AC2 (or GRPO) iteration over the previous iteration's artifacts")
    def iteration_pipeline(
        config_json: str,
        iteration: int,
        problems_uri: str,
        reference_uri: str,
        actor_uri: str,
        critic_uri: str,
        replay_uri: str,
        scored_chunks_uri: str,
        readiness_uri: str,
        metrics_uri: str,
    ) -> Model:
        setup = _on_cluster(config(config_json=config_json).set_display_name("config"), "config", cluster)
        cfg = setup.outputs["config"]
        problems = _import(problems_uri, "problems").output
        reference = _import(reference_uri, "reference").output
        actor = _import(actor_uri, "actor").output
        critic = _import(critic_uri, "critic").output
        replay = _import(replay_uri, "replay").output
        scored_before = _import(scored_chunks_uri, "scored_chunks").output
        readiness = _import(readiness_uri, "readiness").output
        metrics = _import(metrics_uri, "metrics").output
        common = dict(config=cfg, iteration=iteration, problems=problems)

        sampled = stage(
            sample_prefixes,
            "sample_prefixes",
            **common,
            replay=replay,
            scored_chunks=scored_before,
            readiness=readiness,
            actor=actor,
        )
        prefixes, replay_now = sampled.outputs["out_prefixes"], sampled.outputs["out_replay"]
        generated = stage(generate_chunks, "generate_chunks", **common, prefixes=prefixes, actor=actor)
        chunks = generated.outputs["out_chunks"]
        scored = stage(
            score_chunks,
            "score_chunks",
            **common,
            replay=replay_now,
            prefixes=prefixes,
            chunks=chunks,
            actor=actor,
            critic=critic,
        )
        scored_chunks, critic_pairs = scored.outputs["out_scored_chunks"], scored.outputs["out_critic_pairs"]
        ready = stage(
            check_readiness,
            "check_readiness",
            config=cfg,
            iteration=iteration,
            readiness=readiness,
            critic_pairs=critic_pairs,
            scored_chunks=scored_chunks,
        )
        updated = stage(
            update_actor,
            "update_actor",
            **common,
            actor=actor,
            prefixes=prefixes,
            chunks=chunks,
            advantages=ready.outputs["out_advantages"],
            reference=reference,
        )
        evaluated = dict(
            **common,
            actor=updated.outputs["out_actor"],
            prefixes=prefixes,
            chunks=chunks,
            scored_chunks=scored_chunks,
            critic_pairs=critic_pairs,
            readiness=ready.outputs["out_readiness"],
            metrics=metrics,
        )
        with dsl.If(setup.outputs["algorithm"] == "ac2", name="ac2"):
            fitted = stage(
                update_critic,
                "update_critic",
                **common,
                replay=replay_now,
                critic=critic,
                critic_pairs=critic_pairs,
                scored_chunks=scored_chunks,
            )
            stage(evaluate, "evaluate", **evaluated, critic=fitted.outputs["out_critic"])
        with dsl.Else(name="grpo"):
            stage(evaluate, "evaluate", **evaluated)
        return updated.outputs["out_actor"]

    return {"bootstrap": bootstrap_pipeline, "iteration": iteration_pipeline}


# with the default (empty) cluster settings: what kfp.local runs
_DEFAULT = build_pipelines()
bootstrap_pipeline, iteration_pipeline = _DEFAULT["bootstrap"], _DEFAULT["iteration"]
