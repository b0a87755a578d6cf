"""The recipe is the one description of the iteration: the compiled pipeline and the inprocess
runner call the same stages on the same artifacts, and every component and stage function
takes exactly the inputs and outputs the recipe names."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
import yaml

from ac2_core.runner import inprocess
from ac2_core.runner.layout import RunLayout
from ac2_core.stages import recipe
from pipelines import dag, driver
from pipelines.compile import compile_pipeline
from tests.conftest import tiny_config

RUNNER_KEYWORDS = {"iteration", "store", "log", "progress"}  # what a runner passes besides URIs


def _compiled_inputs(spec: dict) -> dict[tuple[str, ...], dict[str, dict[str, tuple]]]:
    """Every stage task of a compiled pipeline, by the branch it sits in (() at the top, ("ac2",)
    inside the ac2 branch): its display name -> input -> where the input comes from, followed
    through the branches: ("parameter", name) through an importer, or ("output", task, key)."""
    found: dict[tuple[str, ...], dict[str, dict[str, tuple]]] = {}

    def walk(tasks: dict, outer: Callable[[str], tuple] | None, branch: tuple[str, ...]) -> None:
        def source(artifact: dict) -> tuple:
            if "componentInputArtifact" in artifact:  # passed into a sub-DAG: look outside it
                return outer(artifact["componentInputArtifact"])
            producer = tasks[artifact["taskOutputArtifact"]["producerTask"]]
            if producer["componentRef"]["name"].startswith("comp-importer"):
                return ("parameter", producer["inputs"]["parameters"]["uri"]["componentInputParameter"])
            return ("output", producer["taskInfo"]["name"], artifact["taskOutputArtifact"]["outputArtifactKey"])

        for task in tasks.values():
            inputs = {name: source(a) for name, a in task.get("inputs", {}).get("artifacts", {}).items()}
            inner = spec["components"][task["componentRef"]["name"]].get("dag")
            if inner:
                named = (task["taskInfo"]["name"],) if "triggerPolicy" in task else ()
                walk(inner["tasks"], inputs.__getitem__, branch + named)
            elif task["taskInfo"]["name"] in recipe.STAGES:
                found.setdefault(branch, {})[task["taskInfo"]["name"]] = inputs

    walk(spec["root"]["dag"]["tasks"], None, ())
    return found


@pytest.mark.parametrize("algorithm", ["ac2", "grpo"])
@pytest.mark.parametrize("iteration", [1, 3])
def test_the_pipeline_and_the_inprocess_runner_wire_the_same_artifacts(tmp_path, algorithm, iteration):
    cfg = tiny_config(algorithm=algorithm)
    spec = yaml.safe_load(compile_pipeline(cfg, tmp_path / "iteration.yaml").read_text())
    branches = _compiled_inputs(spec)
    compiled = {**branches[()], **branches[(algorithm,)]}
    layout = RunLayout(str(tmp_path / "run"))
    # an imported input is the URI the runner passes as its parameter; a task's output
    # out_<name> is the artifact the kfp runner moves to layout.output(iteration, name)
    arguments = driver.pipeline_arguments(cfg, iteration, layout.output)
    components = spec["components"]
    pipeline_calls = {}
    for stage, inputs in compiled.items():
        kwargs = {}
        for keyword, source in inputs.items():
            match source:
                case ("parameter", name):
                    kwargs[keyword] = arguments[name]
                case ("output", producer, key) if producer != "config":
                    assert key.startswith("out_") and key.removeprefix("out_") in recipe.stage(producer).outputs
                    kwargs[keyword] = layout.output(iteration, key.removeprefix("out_"))
        outputs = components[f"comp-{stage.replace('_', '-')}"]["outputDefinitions"]["artifacts"]
        kwargs |= {k: layout.output(iteration, k.removeprefix("out_")) for k in outputs if k.startswith("out_")}
        pipeline_calls[stage] = kwargs
    inprocess_calls = {
        call.stage: {k: v for k, v in call.kwargs.items() if v is not None}
        for call in inprocess.stage_calls(cfg, layout, iteration)
    }
    assert list(inprocess_calls) == [s.name for s in recipe.ITERATION if s.runs_for(cfg)]
    assert pipeline_calls == inprocess_calls
    # under grpo no stage reads a critic of this iteration, and score_chunks gets the bootstrap's
    if algorithm == "grpo":
        assert "update_critic" not in pipeline_calls and "critic" not in pipeline_calls["evaluate"]
        assert pipeline_calls["score_chunks"]["critic"] == layout.bootstrap("critic")
    else:
        assert pipeline_calls["evaluate"]["critic"] == layout.output(iteration, "critic")
        assert pipeline_calls["score_chunks"]["critic"] == layout.output(iteration - 1, "critic")


@pytest.mark.parametrize("stage", [recipe.BOOTSTRAP_STAGE, *recipe.ITERATION], ids=lambda s: s.name)
def test_each_component_and_stage_function_takes_what_the_recipe_names(stage):
    component = dag.COMPONENTS[stage.name].component_spec
    assert set(component.inputs) - {"config", "iteration"} == {inp.keyword for inp in stage.inputs}
    assert {k for k in component.outputs if k.startswith("out_")} == set(stage.out_keywords)
    # an input the component may go without is one the recipe lets the stage take as None
    assert all(recipe.optional(stage, inp) for inp in stage.inputs if component.inputs[inp.keyword].optional)
    params = inspect.signature(stage.function()).parameters
    assert set(params) - {"cfg"} - RUNNER_KEYWORDS == {inp.keyword for inp in stage.inputs} | set(stage.out_keywords)
    assert ("store" in params) == stage.models and ("log" in params) == stage.logs
    # an input the stage may take as None has a None default or type
    for inp in stage.inputs:
        p = params[inp.keyword]
        assert recipe.optional(stage, inp) == (p.default is None or "None" in str(p.annotation)), inp.keyword
