"""The compiled IR: tasks, their dependencies, the algorithm branch, artifact types, no pip installs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kfp import components

from pipelines.compile import compile_pipeline
from tests.conftest import tiny_config

STAGES = ["sample_prefixes", "generate_chunks", "score_chunks", "check_readiness", "update_actor", "update_critic", "evaluate"]


def _compiled(tmp_path, algorithm: str, which: str = "iteration") -> dict:
    path = compile_pipeline(tiny_config(algorithm=algorithm), tmp_path / f"{algorithm}-{which}.yaml", which)
    return yaml.safe_load(path.read_text())


def _tasks(spec: dict) -> dict[str, dict]:
    """Every task of the pipeline, nested branches included, by task name."""
    found, pending = {}, [spec["root"]["dag"]["tasks"]]
    while pending:
        for name, task in pending.pop().items():
            found[name] = task
            inner = spec["components"][task["componentRef"]["name"]].get("dag")
            if inner:
                pending.append(inner["tasks"])
    return found


def _by_display_name(spec: dict) -> dict[str, list[tuple[str, dict]]]:
    out: dict[str, list] = {}
    for name, task in _tasks(spec).items():
        out.setdefault(task["taskInfo"]["name"], []).append((name, task))
    return out


@pytest.mark.parametrize("algorithm", ["ac2", "grpo"])
def test_iteration_dag(tmp_path, algorithm):
    spec = _compiled(tmp_path, algorithm)
    tasks = _by_display_name(spec)
    assert set(STAGES) <= set(tasks)
    assert len(tasks["evaluate"]) == 2  # one per algorithm branch
    (sp,), (gc,), (sc,), (cr,), (ua,) = (tasks[s] for s in STAGES[:5])
    deps = lambda t: set(t[1].get("dependentTasks", []))  # noqa: E731
    assert {"sample-prefixes"} <= deps(gc)
    assert {"sample-prefixes", "generate-chunks"} <= deps(sc)
    assert {"score-chunks"} <= deps(cr)
    assert {"check-readiness", "generate-chunks", "sample-prefixes"} <= deps(ua)
    (uc,) = tasks["update_critic"]
    (ev_ac2,) = [t for t in tasks["evaluate"] if "update-critic" in deps(t)]
    (ev_grpo,) = [t for t in tasks["evaluate"] if t is not ev_ac2]
    assert "critic" in ev_ac2[1]["inputs"]["artifacts"] and "critic" not in ev_grpo[1]["inputs"]["artifacts"]
    # the branch: grpo takes the Else (no update_critic, evaluate without a critic)
    root = spec["root"]["dag"]["tasks"]
    (branches,) = [t for t in root.values() if t["componentRef"]["name"].startswith("comp-condition-branches")]
    assert {"check-readiness", "update-actor", "config"} <= set(branches["dependentTasks"])
    conditions = {
        t["taskInfo"]["name"]: t["triggerPolicy"]["condition"]
        for t in spec["components"][branches["componentRef"]["name"]]["dag"]["tasks"].values()
    }
    assert conditions["ac2"] == "inputs.parameter_values['pipelinechannel--config-algorithm'] == 'ac2'"
    assert conditions["grpo"] == "!(inputs.parameter_values['pipelinechannel--config-algorithm'] == 'ac2')"
    # the config travels as one artifact and one parameter, never as many parameters
    assert set(spec["root"]["inputDefinitions"]["parameters"]) == {
        "config_json",
        "iteration",
        "problems_uri",
        "reference_uri",
        "actor_uri",
        "critic_uri",
        "replay_uri",
        "scored_chunks_uri",
        "readiness_uri",
        "metrics_uri",
    }
    assert (
        spec["root"]["inputDefinitions"]["parameters"]["config_json"]["defaultValue"]
        == tiny_config(algorithm=algorithm).to_json()
    )
    for name, task in _tasks(spec).items():
        if task["taskInfo"]["name"] in STAGES:
            source = task["inputs"]["artifacts"]["config"]  # from the config task, or passed into a branch
            assert (
                source.get("taskOutputArtifact", {}).get("producerTask") == "config"
                or source.get("componentInputArtifact") == "pipelinechannel--config-config"
            )
            assert not task.get("cachingOptions", {}).get("enableCache"), name


def test_artifact_types_and_no_pip_installs(tmp_path):
    spec = _compiled(tmp_path, "ac2")
    comps = spec["components"]
    out_types = lambda c: {k: v["artifactType"]["schemaTitle"] for k, v in comps[c]["outputDefinitions"]["artifacts"].items()}  # noqa: E731
    in_types = lambda c: {k: v["artifactType"]["schemaTitle"] for k, v in comps[c]["inputDefinitions"]["artifacts"].items()}  # noqa: E731
    assert out_types("comp-sample-prefixes") == {"out_replay": "system.Dataset", "out_prefixes": "system.Dataset"}
    assert out_types("comp-update-actor") == {"out_actor": "system.Model"}
    assert out_types("comp-update-critic") == {"out_critic": "system.Model"}
    assert out_types("comp-evaluate") == {
        "out_samples": "system.Dataset",
        "out_metrics": "system.Dataset",
        "figures": "system.Metrics",
        "report": "system.Markdown",
    }
    assert in_types("comp-score-chunks")["critic"] == "system.Model"
    assert in_types("comp-score-chunks")["config"] == "system.Artifact"
    assert comps["comp-evaluate-2"]["inputDefinitions"]["artifacts"]["critic"]["isOptional"] is True
    execs = spec["deploymentSpec"]["executors"]
    images = {e["container"]["image"] for e in execs.values() if "container" in e}
    assert images == {"ghcr.io/ac2/ac2-cpu:0.1.0"}
    for name, e in execs.items():
        if "container" in e:
            text = " ".join(e["container"]["command"] + e["container"].get("args", []))
            assert "pip install" not in text and "kfp==" not in text, name
    boot = _compiled(tmp_path, "ac2", "bootstrap")
    assert {
        k: v["artifactType"]["schemaTitle"]
        for k, v in boot["components"]["comp-bootstrap"]["outputDefinitions"]["artifacts"].items()
    } == {
        "out_problems": "system.Dataset",
        "out_actor": "system.Model",
        "out_critic": "system.Model",
        "out_replay": "system.Dataset",
        "out_scored_chunks": "system.Dataset",
        "out_readiness": "system.Dataset",
        "out_metrics": "system.Dataset",
    }


def test_compiled_yaml_loads_back(tmp_path):
    for which in ("iteration", "bootstrap"):
        path = compile_pipeline(tiny_config(), tmp_path / f"{which}.yaml", which)
        loaded = components.load_component_from_file(str(path))
        assert loaded.name == f"ac2-{which}"
        assert "config_json" in loaded.component_spec.inputs


def test_compile_command_writes_yaml_and_refuses_a_bad_config(tmp_path, capsys):
    from pipelines.cli import main
    from tests.pipeline.conftest import config_file

    good = config_file(tiny_config(), tmp_path)
    assert main(["compile", "--config", str(good), "--out", str(tmp_path / "it.yaml")]) == 0
    assert yaml.safe_load((tmp_path / "it.yaml").read_text())["pipelineInfo"]["name"] == "ac2-iteration"
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("algorithm: ac2", "algorithm: ppo"))
    for argv in (
        ["compile", "--config", str(bad), "--out", str(tmp_path / "x.yaml")],
        ["submit", "--host", "http://127.0.0.1:9", "--config", str(bad), "--dry-run"],
        ["stage", "evaluate", "--config", str(bad)],
        ["run", "--config", str(bad), "--out", str(tmp_path / "run")],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"ac2: invalid config {bad}:") and "algorithm" in err
    assert not (tmp_path / "x.yaml").exists() and not (tmp_path / "run").exists()


def test_validate_prints_the_most_chunk_mode_can_save(tmp_path, capsys):
    import json

    from pipelines.cli import main

    toy = Path(__file__).resolve().parents[2] / "pipelines" / "configs" / "toy.yaml"
    # the toy as it was: 6 terms (answers of ~57 tokens), 2 prefixes of 16, half revisits, a quarter probes
    argv = ["validate", "--config", str(toy), "--set", "task.n_terms=6", "--set", "rollout.prefixes_per_problem=2"]
    argv += ["--set", "rollout.revisit_fraction=0.5", "--set", "rollout.probe_fraction=0.25"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert 55 < report["answer_tokens"] < 59
    assert report["chunk_saving_bound"] == pytest.approx(0.5 * 0.75 * (1 - 32 / report["answer_tokens"]), abs=1e-4)
    assert main(["validate", "--config", str(toy), "--set", "algorithm=grpo"]) == 0
    assert "chunk_saving_bound" not in json.loads(capsys.readouterr().out)  # GRPO has no chunk mode
