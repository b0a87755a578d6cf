"""The container images: what each Dockerfile installs, as whom, and that the pipelines use exactly the images built.

No Docker engine here: the Dockerfiles are read, not built. The checks tie each pin to
its one source (pyproject.toml, the Makefile, components/image.py).
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from ac2_core.config import parse_config
from components import image
from pipelines.compile import compile_pipeline
from tests.conftest import tiny_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the venv runs 3.11; pip vendors a tomllib for older Pythons
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
EXTRAS = {"images/cpu/Dockerfile": {"kfp", "s3"}, "images/gpu/Dockerfile": {"kfp", "s3", "vllm", "deepspeed"}}


def instructions(path: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = (ROOT / path).read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^\s*(\w+)\s+(.*)$", joined, re.M)]


def final_stage(steps: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def arg_defaults(steps: list[tuple[str, str]]) -> dict[str, str]:
    return dict(arg.split("=", 1) for op, arg in steps if op == "ARG" and "=" in arg)


def pip_installs(steps: list[tuple[str, str]]) -> list[list[str]]:
    """The argument lists of every ``pip install`` in RUN steps, in order."""
    found = []
    for op, arg in steps:
        if op == "RUN":
            for command in re.split(r"&&|;", arg):
                words = shlex.split(command)
                if words[:2] == ["pip", "install"]:
                    found.append(words[2:])
    return found


def requirements(words: list[str]) -> list[str]:
    """The requirement words of a ``pip install``, options and their values dropped."""
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in {"--constraint", "-c", "--index-url", "-i", "--extra-index-url"}:
            skip = True
        elif not word.startswith("-"):
            out.append(word)
    return out


def expand(word: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], word)


@pytest.mark.parametrize("dockerfile", sorted(EXTRAS))
def test_dockerfile_installs_the_pinned_package_with_its_extras_after_pinned_torch(dockerfile):
    steps = instructions(dockerfile)
    final = final_stage(steps)
    args = arg_defaults(final)
    installs = [[expand(w, args) for w in requirements(words)] for words in pip_installs(final)]
    # the package: the wheel of exactly the pyproject version, with the image's extras
    wheel = re.compile(r"^/wheels/ac2-(?P<version>[^-]+)-py3-none-any\.whl\[(?P<extras>[\w,]+)\]$")
    (package_step,) = [i for i, words in enumerate(installs) if any(wheel.match(w) for w in words)]
    (m,) = [wheel.match(w) for w in installs[package_step] if wheel.match(w)]
    assert m["version"] == VERSION
    assert set(m["extras"].split(",")) == EXTRAS[dockerfile]
    assert EXTRAS[dockerfile] <= set(PYPROJECT["project"]["optional-dependencies"])
    # torch: pinned to the Makefile's version, installed in a step of its own before the package
    makefile_torch = re.search(r"pip install -q torch==(\S+)", (ROOT / "Makefile").read_text()).group(1)
    assert args["TORCH_VERSION"] == makefile_torch
    torch_steps = [i for i, words in enumerate(installs) if f"torch=={makefile_torch}" in words]
    assert torch_steps and torch_steps[0] < package_step
    assert installs[torch_steps[0]] == [f"torch=={makefile_torch}"]
    # and held there while the package's dependencies resolve
    assert "--constraint" in pip_installs(final)[package_step]
    # every base image is pinned to a version tag
    for op, arg in steps:
        if op == "FROM":
            ref = expand(arg.split()[0], arg_defaults(steps))
            assert re.search(r":\d[\w.-]*$", ref) and not ref.endswith(":latest"), ref


@pytest.mark.parametrize("dockerfile", sorted(EXTRAS))
def test_dockerfile_runs_as_a_non_root_user(dockerfile):
    final = final_stage(instructions(dockerfile))
    users = [arg for op, arg in final if op == "USER"]
    assert users, f"{dockerfile} sets no USER"
    uid = users[-1].split(":")[0]
    assert uid not in {"root", "0"} and uid.isdigit(), users[-1]
    # the user is created with that uid, and owns the launcher's artifact folders
    creates = [arg for op, arg in final if op == "RUN" and "useradd" in arg]
    assert creates and f"--uid {uid}" in creates[0]
    assert re.search(r"chown \S+ /gcs /minio /s3", creates[0])


def test_gpu_pins_fit_the_package_and_each_other():
    args = arg_defaults(instructions("images/gpu/Dockerfile"))
    extras = PYPROJECT["project"]["optional-dependencies"]
    for name, pinned in (("vllm", args["VLLM_VERSION"]), ("deepspeed", args["DEEPSPEED_VERSION"])):
        (req,) = [Requirement(r) for r in extras[name] if Requirement(r).name == name]
        assert Version(pinned) in req.specifier, f"{name}=={pinned} is outside the package's {req}"
    torch_floor = [Requirement(r) for r in PYPROJECT["project"]["dependencies"] if r.startswith("torch")][0]
    assert Version(args["TORCH_VERSION"]) in torch_floor.specifier
    assert args["CUDA_IMAGE"].startswith("nvidia/cuda:13.")  # torch 2.13.0's PyPI wheels are built for CUDA 13


def test_image_names_are_one_version_and_each_has_its_dockerfile():
    assert image.VERSION == VERSION
    assert image.IMAGE == image.CPU_IMAGE
    assert set(image.DOCKERFILES) == {image.CPU_IMAGE, image.GPU_IMAGE}
    for ref, dockerfile in image.DOCKERFILES.items():
        assert ref.endswith(f":{VERSION}") and (ROOT / dockerfile).is_file()
        assert f"-t {ref} ." in (ROOT / dockerfile).read_text()  # the build command in its header
    assert set(EXTRAS) == set(image.DOCKERFILES.values())


def _executor_images(path: Path) -> dict[str, str]:
    spec = next(yaml.safe_load_all(path.read_text()))
    executors = spec["deploymentSpec"]["executors"].items()
    return {name: e["container"]["image"] for name, e in executors if "container" in e}  # importers have none


def test_compiled_pipelines_use_only_the_images_built(tmp_path):
    gpu = parse_config(tiny_config().model_dump(mode="json") | {"cluster": {"gpu": {"accelerator_count": 1}}})
    seen = set()
    for name, cfg in (("default", tiny_config()), ("gpu", gpu)):
        for which in ("iteration", "bootstrap"):
            images = _executor_images(compile_pipeline(cfg, tmp_path / f"{name}-{which}.yaml", which))
            seen |= set(images.values())
            if name == "gpu" and which == "iteration":
                for stage in cfg.cluster.gpu.stages:
                    assert images[f"exec-{stage.replace('_', '-')}"] == image.GPU_IMAGE, stage
                assert images["exec-sample-prefixes"] == images["exec-config"] == image.CPU_IMAGE
    assert seen == set(image.DOCKERFILES)
