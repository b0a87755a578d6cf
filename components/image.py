"""The container images the components run in: the one place they are named.

``images/cpu/Dockerfile`` and ``images/gpu/Dockerfile`` build them, each installing this
package at ``VERSION`` (the ``[project] version`` of pyproject.toml);
tests/pipeline/test_images.py checks that the three agree. Every component's
``base_image`` is ``IMAGE``; a task that asks for GPUs runs in ``GPU_IMAGE`` instead
(``pipelines.dag``). To push to another registry, change ``REGISTRY`` here.
"""

REGISTRY = "ghcr.io/ac2"
VERSION = "0.1.0"

CPU_IMAGE = f"{REGISTRY}/ac2-cpu:{VERSION}"
GPU_IMAGE = f"{REGISTRY}/ac2-gpu:{VERSION}"
IMAGE = CPU_IMAGE

# image -> the Dockerfile that builds it (paths from the repository root, the build context)
DOCKERFILES = {CPU_IMAGE: "images/cpu/Dockerfile", GPU_IMAGE: "images/gpu/Dockerfile"}
