"""How the pipelines' tasks run on Kubernetes: the config's ``cluster`` section.

Applied at compile time through kfp-kubernetes (``pipelines.dag``); kfp.local and the
inprocess runner ignore all of it, and the defaults ask for nothing. See ``k8s/`` and the
README's "Run on Kubeflow".
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_serializer, field_validator, model_validator

from ac2_core.config.base import Section, plain_url
from ac2_core.stages.recipe import STAGES

ClusterStage = Literal[STAGES]  # a stage's name, as the recipe declares it
# the formats kfp accepts for set_cpu_*/set_memory_* (checked here so the error names the field)
_CPU = r"^([0-9]*[.])?[0-9]+m?$"
_MEMORY = r"^[0-9]+(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?$"
_DNS_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL_KEY = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
_LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"


class TolerationConfig(Section):
    """One pod toleration, with the fields of a Kubernetes pod spec."""

    key: str | None = Field(None, pattern=_LABEL_KEY, description="taint key; unset (with operator Exists): every taint")
    operator: Literal["Equal", "Exists"] = Field("Equal", description="Equal: key and value match; Exists: the key alone")
    value: str | None = Field(None, pattern=_LABEL_VALUE, description="taint value (operator Equal)")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(None, description="unset: every effect")

    @model_validator(mode="after")
    def _operator_fits(self) -> TolerationConfig:
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("value must be unset when operator is Exists")
        if self.key is None and self.operator != "Exists":
            raise ValueError("key is required unless operator is Exists")
        return self


class TaskResourcesConfig(Section):
    """Requests and limits of one kind of task; unset: the namespace's defaults (its LimitRange)."""

    cpu_request: str | None = Field(None, pattern=_CPU, description="CPU request, e.g. '4' or '500m'")
    cpu_limit: str | None = Field(None, pattern=_CPU, description="CPU limit")
    memory_request: str | None = Field(None, pattern=_MEMORY, description="memory request, e.g. '16Gi'")
    memory_limit: str | None = Field(None, pattern=_MEMORY, description="memory limit")


class GpuStagesConfig(TaskResourcesConfig):
    """The stages that run on GPU nodes: their accelerators, node selection and shared memory."""

    stages: tuple[ClusterStage, ...] = Field(
        ("generate_chunks", "score_chunks", "update_actor", "update_critic"),
        description="stages that take these settings (and the GPU image while accelerator_count > 0)",
    )
    accelerator_type: str = Field("nvidia.com/gpu", min_length=1, description="resource the GPU device plugin advertises")
    accelerator_count: int = Field(0, ge=0, le=64, description="GPUs per task; 0: no GPU, the CPU image")
    node_selector: tuple[tuple[str, str], ...] = Field(
        (), description="node labels the tasks must match, as a mapping, e.g. {nvidia.com/gpu.present: 'true'}"
    )
    tolerations: tuple[TolerationConfig, ...] = Field((), description="taints of the GPU nodes that the tasks tolerate")
    shm_size: str | None = Field(
        None, pattern=_MEMORY, description="size of a memory-backed /dev/shm (NCCL, vLLM outgrow the 64Mi default); unset: none"
    )

    @field_validator("node_selector", mode="before")
    @classmethod
    def _mapping_to_pairs(cls, value):
        # written as a mapping; kept as sorted pairs so that the frozen config stays hashable
        return tuple(sorted(value.items())) if isinstance(value, dict) else value

    @field_serializer("node_selector")
    def _pairs_to_mapping(self, pairs: tuple[tuple[str, str], ...]) -> dict[str, str]:
        return dict(pairs)

    @model_validator(mode="after")
    def _labels_are_kubernetes_labels(self) -> GpuStagesConfig:
        for key, value in self.node_selector:
            if not re.match(_LABEL_KEY, key) or not re.match(_LABEL_VALUE, value):
                raise ValueError(f"node_selector {key}: {value!r} is not a Kubernetes label ([prefix/]name: value)")
        if len(set(self.stages)) != len(self.stages):
            raise ValueError(f"stages lists a stage twice: {list(self.stages)}")
        return self


class SecretKeyConfig(Section):
    """One key of a Kubernetes Secret (only its name and key: the value never enters ac2)."""

    name: str = Field(..., pattern=_DNS_NAME, max_length=253, description="the Secret's name")
    key: str = Field(..., pattern=r"^[-._a-zA-Z0-9]+$", max_length=253, description="the key within the Secret")


class ClusterConfig(Section):
    """How the pipelines' tasks run on Kubernetes (kfp-kubernetes; see k8s/ and README "Run on Kubeflow").

    kfp.local and the inprocess runner ignore all of it, and the defaults ask for nothing,
    so a local run compiles exactly as it would without this section.
    """

    s3_secret: str | None = Field(
        None,
        pattern=_DNS_NAME,
        max_length=253,
        description="Secret whose AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY every stage gets as env (k8s/: ac2-s3); unset: none",
    )
    s3_endpoint_url: str | None = Field(
        None, description="the stages' AWS_ENDPOINT_URL_S3, for an in-cluster store the submitting machine reaches elsewhere"
    )
    judge_secret: SecretKeyConfig | None = Field(
        None,
        description="Secret key holding the rubric judge's API key: the grading stages (bootstrap, score_chunks, evaluate)"
        " get it as the env variable task.judge.api_key_env names; unset: none",
    )
    tasks: TaskResourcesConfig = Field(TaskResourcesConfig(), description="every task not in gpu.stages")
    gpu: GpuStagesConfig = GpuStagesConfig()

    @model_validator(mode="after")
    def _endpoint_is_a_plain_url(self) -> ClusterConfig:
        if self.s3_endpoint_url is not None:
            plain_url(self.s3_endpoint_url, "s3_endpoint_url")
        return self
