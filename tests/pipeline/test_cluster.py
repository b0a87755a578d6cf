"""The cluster side: k8s/ manifests, kfp-kubernetes settings in the compiled IR, no secrets anywhere, the README's commands.

No kubectl and no cluster here. ``render`` below builds a kustomization the way
``kubectl kustomize`` does for the features k8s/ uses (resources, namespace, labels, a
secretGenerator without hash suffix, strategic-merge patches of maps and ``$patch:
delete``) and refuses any other, so a new feature in k8s/ fails here until it is covered.
Every rendered object is validated against the Kubernetes OpenAPI schemas that ship with
``kubernetes-validate``.
"""

from __future__ import annotations

import base64
import copy
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from ac2_core.config import ClusterConfig, ConfigError, parse_config
from components import image
from pipelines.compile import compile_pipeline
from pipelines.dag import GRADING_TASKS, S3_SECRET_KEYS
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
OVERLAYS = ("local-dev", "gpu-cluster")
KUBERNETES_VERSION = "1.30.0"  # the oldest minor that current Kubeflow releases support
CLUSTER_SCOPED = {"Namespace"}
KNOWN_KEYS = {"apiVersion", "kind", "namespace", "labels", "resources", "patches", "secretGenerator"}
FAKE_KEY_ID, FAKE_SECRET = "AKIAFAKEFAKEFAKEFAKE", "fake/secret+value/for/tests/only0000000"


# --- a small kustomize ---------------------------------------------------------------


def render(folder: Path) -> list[dict]:
    """The objects ``kubectl kustomize folder`` prints, for the features k8s/ uses."""
    kust = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(kust) - KNOWN_KEYS
    assert not unknown, f"{folder}/kustomization.yaml uses {sorted(unknown)}: teach render() first"
    objects: list[dict] = []
    for entry in kust.get("resources", []):
        path = (folder / entry).resolve()
        objects += render(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
    objects += [_secret(folder, gen) for gen in kust.get("secretGenerator", [])]
    for patch in kust.get("patches", []):
        assert set(patch) <= {"path", "patch"}, f"patch options {sorted(patch)}: teach render() first"
        body = yaml.safe_load((folder / patch["path"]).read_text() if "path" in patch else patch["patch"])
        objects = _apply(objects, body)
    if "namespace" in kust:
        for obj in objects:
            if obj["kind"] in CLUSTER_SCOPED:
                if obj["kind"] == "Namespace":  # kustomize renames a Namespace object too
                    obj["metadata"]["name"] = kust["namespace"]
            else:
                obj["metadata"]["namespace"] = kust["namespace"]
    for label in kust.get("labels", []):
        assert set(label) == {"pairs"}, "labels with selectors: teach render() first"
        for obj in objects:
            obj["metadata"].setdefault("labels", {}).update(label["pairs"])
    return objects


def _secret(folder: Path, gen: dict) -> dict:
    assert set(gen) <= {"name", "type", "envs", "options"}, f"secretGenerator {sorted(gen)}: teach render() first"
    assert gen.get("options", {}).get("disableNameSuffixHash") is True, "a hashed name cannot be referenced by KFP"
    data = {}
    for env in gen["envs"]:
        for line in (folder / env).read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                data[key.strip()] = base64.b64encode(value.encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": gen["name"]},
        "type": gen.get("type", "Opaque"),
        "data": data,
    }


def _apply(objects: list[dict], patch: dict) -> list[dict]:
    key = (patch["kind"], patch["metadata"]["name"])
    matches = [o for o in objects if (o["kind"], o["metadata"]["name"]) == key]
    assert len(matches) == 1, f"patch {key} matches {len(matches)} objects"
    if patch.get("$patch") == "delete":
        return [o for o in objects if o is not matches[0]]
    _merge(matches[0], copy.deepcopy(patch))
    return objects


def _merge(target: dict, patch: dict) -> None:
    for key, value in patch.items():
        assert not isinstance(value, list), f"a list in a patch ({key}): teach render() the merge keys first"
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


@pytest.fixture(scope="module")
def k8s_copy(tmp_path_factory) -> Path:
    """k8s/ with the credentials file as someone fills it in (fake values; any real one stays out)."""
    copy_root = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, copy_root, ignore=shutil.ignore_patterns("*.env"))
    (copy_root / "base" / "s3-credentials.env").write_text(
        f"AWS_ACCESS_KEY_ID={FAKE_KEY_ID}\nAWS_SECRET_ACCESS_KEY={FAKE_SECRET}\n"
    )
    return copy_root


def _by_kind(objects: list[dict]) -> dict[str, dict]:
    kinds = [o["kind"] for o in objects]
    assert len(kinds) == len(set(kinds)), kinds
    return {o["kind"]: o for o in objects}


# --- k8s/ ----------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_to_valid_kubernetes_objects(k8s_copy, overlay):
    objects = render(k8s_copy / "overlays" / overlay)
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)  # raises on any schema violation
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "ac2"
    kinds = _by_kind(objects)
    namespace = {"local-dev": "kubeflow", "gpu-cluster": "ac2"}[overlay]
    assert {o["metadata"]["namespace"] for o in objects if o["kind"] != "Namespace"} == {namespace}
    expected = {"ServiceAccount", "ConfigMap", "Secret"} | {
        "local-dev": set(),  # KFP's own namespace is not ours to manage
        "gpu-cluster": {"Namespace", "ResourceQuota", "LimitRange"},
    }[overlay]
    assert set(kinds) == expected
    if overlay == "gpu-cluster":
        assert kinds["Namespace"]["metadata"]["name"] == namespace
        assert "requests.nvidia.com/gpu" in kinds["ResourceQuota"]["spec"]["hard"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kfp_launcher_points_kfp_at_s3_with_the_secret_by_reference(k8s_copy, overlay):
    kinds = _by_kind(render(k8s_copy / "overlays" / overlay))
    launcher, secret = kinds["ConfigMap"], kinds["Secret"]
    assert launcher["metadata"]["name"] == "kfp-launcher"
    assert re.match(r"^s3://[a-z0-9][a-z0-9.-]+[a-z0-9](/[\w./-]+)?$", launcher["data"]["defaultPipelineRoot"])
    s3 = yaml.safe_load(launcher["data"]["providers"])["s3"]["default"]
    assert set(s3) <= {"endpoint", "region", "disableSSL", "forcePathStyle", "maxRetries", "credentials"}
    assert "://" not in s3["endpoint"]  # the launcher takes host[:port]; disableSSL picks the scheme
    assert s3["credentials"] == {
        "fromEnv": False,
        "secretRef": {"secretName": "ac2-s3", "accessKeyKey": "AWS_ACCESS_KEY_ID", "secretKeyKey": "AWS_SECRET_ACCESS_KEY"},
    }
    # the same Secret, with the same keys, that the pipeline tasks get as env
    assert secret["metadata"]["name"] == s3["credentials"]["secretRef"]["secretName"]
    assert tuple(secret["data"]) == S3_SECRET_KEYS
    assert base64.b64decode(secret["data"]["AWS_ACCESS_KEY_ID"]).decode() == FAKE_KEY_ID
    assert launcher["metadata"]["namespace"] == secret["metadata"]["namespace"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_cluster_section_matches_its_manifests(k8s_copy, overlay, tmp_path):
    section = yaml.safe_load((K8S / "overlays" / overlay / "ac2-cluster.yaml").read_text())
    cluster = ClusterConfig.model_validate(section)
    secret = _by_kind(render(k8s_copy / "overlays" / overlay))["Secret"]
    assert cluster.s3_secret == secret["metadata"]["name"]
    if overlay == "gpu-cluster":
        quota = _by_kind(render(k8s_copy / "overlays" / overlay))["ResourceQuota"]["spec"]["hard"]
        # one run's GPU stages run one at a time, so a quota of one task's GPUs would do; it allows several
        assert int(quota["requests.nvidia.com/gpu"]) >= cluster.gpu.accelerator_count > 0


def test_secret_has_no_values_in_the_repository():
    template = (K8S / "base" / "s3-credentials.env.template").read_text()
    assert [line for line in template.splitlines() if line.strip()] == [f"{k}=" for k in S3_SECRET_KEYS]
    # what the secretGenerator reads is ignored by git, so a filled-in copy cannot be committed
    ignored = subprocess.run(["git", "check-ignore", "-q", "k8s/base/s3-credentials.env"], cwd=ROOT)
    assert ignored.returncode == 0, "k8s/base/s3-credentials.env is not git-ignored"
    # nothing git would commit holds an access key, a secret key value or a placeholder for one
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    )
    files = listed.stdout.decode().split("\0")
    value = re.compile(r"(AWS_SECRET_ACCESS_KEY|AWS_ACCESS_KEY_ID|secretKey|accessKey)\s*[=:]\s*['\"]?(?!AWS_)[A-Za-z0-9/+]{8,}")
    for name in filter(None, files):
        path = ROOT / name
        if path.suffix in {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".env", ".template", ""} and path.is_file():
            text = path.read_text(errors="replace")
            assert not re.search(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b", text) or path == Path(__file__), name
            assert not value.search(text), name
            if name.startswith("k8s/"):
                assert not re.search(r"REPLACE_ME|CHANGEME|changeme|<your", text), name


# --- the compiled pipelines ----------------------------------------------------------


def _compiled(cfg, tmp_path, which="iteration") -> tuple[dict, dict, str]:
    """(pipeline spec, Kubernetes platform spec by executor, the whole YAML text)."""
    path = compile_pipeline(cfg, tmp_path / f"{which}.yaml", which)
    text = path.read_text()
    docs = list(yaml.safe_load_all(text))
    platform = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"] if len(docs) > 1 else {}
    return docs[0], platform, text


def _overlay_config(overlay: str, **over):
    section = yaml.safe_load((K8S / "overlays" / overlay / "ac2-cluster.yaml").read_text())
    return parse_config(tiny_config().model_dump(mode="json") | {"cluster": section | over})


def test_default_cluster_settings_compile_to_exactly_the_local_pipeline(tmp_path):
    for which in ("iteration", "bootstrap"):
        spec, platform, text = _compiled(tiny_config(), tmp_path, which)
        assert platform == {} and "\n---\n" not in text  # one document: no kfp-kubernetes settings at all
        for name, e in spec["deploymentSpec"]["executors"].items():
            if "container" in e:
                assert "resources" not in e["container"] and "env" not in e["container"], name
                assert e["container"]["image"] == image.CPU_IMAGE


def test_gpu_stages_get_accelerators_resources_nodes_tolerations_and_shm(tmp_path, monkeypatch):
    # credentials in this process's environment must not leak into the spec
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    cfg = _overlay_config("gpu-cluster")
    gpu, tasks = cfg.cluster.gpu, cfg.cluster.tasks
    spec, platform, text = _compiled(cfg, tmp_path)
    executors = spec["deploymentSpec"]["executors"]
    containers = {name: e["container"] for name, e in executors.items() if "container" in e}
    assert set(containers) >= {f"exec-{s.replace('_', '-')}" for s in gpu.stages}
    for name, container in containers.items():
        stage = "config" if name == "exec-config" else re.sub(r"-\d+$", "", name[len("exec-") :]).replace("-", "_")
        on_gpu = stage in gpu.stages
        want = gpu if on_gpu else tasks
        res = container["resources"]
        assert (res["resourceCpuRequest"], res["resourceCpuLimit"]) == (want.cpu_request, want.cpu_limit), name
        assert (res["resourceMemoryRequest"], res["resourceMemoryLimit"]) == (want.memory_request, want.memory_limit), name
        k8s = platform.get(name, {})
        if on_gpu:
            assert res["accelerator"]["resourceType"] == "nvidia.com/gpu"
            assert res["accelerator"]["resourceCount"] == str(gpu.accelerator_count)
            assert container["image"] == image.GPU_IMAGE
            assert k8s["nodeSelector"] == {"labels": {"nvidia.com/gpu.present": "true"}}
            assert k8s["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
            assert k8s["emptyDirMounts"] == [
                {"volumeName": "dshm", "mountPath": "/dev/shm", "medium": "Memory", "sizeLimit": gpu.shm_size}
            ]
        else:
            assert "accelerator" not in res and container["image"] == image.CPU_IMAGE, name
            assert not {"nodeSelector", "tolerations", "emptyDirMounts"} & set(k8s), name
        if stage == "config":  # it reads nothing from object storage
            assert "secretAsEnv" not in k8s
        else:
            (secret,) = k8s["secretAsEnv"]
            assert secret["secretName"] == "ac2-s3" and secret["optional"] is False
            assert secret["secretNameParameter"] == {"runtimeValue": {"constant": "ac2-s3"}}
            assert secret["keyToEnv"] == [{"secretKey": k, "envVar": k} for k in S3_SECRET_KEYS]
    assert FAKE_KEY_ID not in text and FAKE_SECRET not in text
    assert not re.search(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b", text)


def test_local_dev_settings_compile_with_the_in_cluster_endpoint_and_no_gpus(tmp_path):
    cfg = _overlay_config("local-dev")
    spec, platform, text = _compiled(cfg, tmp_path, "bootstrap")
    boot = spec["deploymentSpec"]["executors"]["exec-bootstrap"]["container"]
    assert boot["env"] == [{"name": "AWS_ENDPOINT_URL_S3", "value": "http://minio-service.kubeflow:9000"}]
    assert boot["image"] == image.CPU_IMAGE and "accelerator" not in boot["resources"]
    assert set(platform) == {"exec-bootstrap"} and set(platform["exec-bootstrap"]) == {"secretAsEnv"}


FAKE_JUDGE_KEY = "sk-fake-judge-key-for-tests-only-7c2e"


def _proof_config(cluster: dict):
    """A proof task graded by a judge whose key is in the env variable JUDGE_API_KEY."""
    task = {
        "name": "proof",
        "data": "s3://ac2-data/fineproofs.parquet",
        "judge": {"base_url": "http://judge.ac2:8000/v1", "model": "judge", "api_key_env": "JUDGE_API_KEY"},
    }
    return parse_config(tiny_config().model_dump(mode="json") | {"task": task, "cluster": cluster})


def test_grading_tasks_get_the_judge_key_from_its_secret_and_no_value(tmp_path, monkeypatch):
    monkeypatch.setenv("JUDGE_API_KEY", FAKE_JUDGE_KEY)  # the submitting machine's key must not leak
    section = yaml.safe_load((K8S / "overlays" / "gpu-cluster" / "ac2-cluster.yaml").read_text())
    cfg = _proof_config(section | {"judge_secret": {"name": "ac2-judge", "key": "api-key"}})
    judge_env = {"secretName": "ac2-judge", "secretNameParameter": {"runtimeValue": {"constant": "ac2-judge"}}}
    judge_env |= {"keyToEnv": [{"secretKey": "api-key", "envVar": "JUDGE_API_KEY"}], "optional": False}
    seen = set()
    for which in ("iteration", "bootstrap"):
        spec, platform, text = _compiled(cfg, tmp_path, which)
        for name, e in spec["deploymentSpec"]["executors"].items():
            if "container" not in e:
                continue
            stage = "config" if name == "exec-config" else re.sub(r"-\d+$", "", name[len("exec-") :]).replace("-", "_")
            secrets = {s["secretName"]: s for s in platform.get(name, {}).get("secretAsEnv", [])}
            if stage in GRADING_TASKS:
                seen.add(stage)
                assert secrets.get("ac2-judge") == judge_env, name
                assert "ac2-s3" in secrets, name  # next to the S3 keys, not instead of them
            else:
                assert "ac2-judge" not in secrets, name
        assert FAKE_JUDGE_KEY not in text and "JUDGE_API_KEY" in text
    # both evaluate tasks (ac2 and grpo branches) map to "evaluate": every grading task was compiled
    assert seen == set(GRADING_TASKS)


def test_judge_secret_without_a_variable_to_fill_is_refused():
    with pytest.raises(ConfigError) as err:
        parse_config({"cluster": {"judge_secret": {"name": "ac2-judge", "key": "api-key"}}})
    assert "cluster.judge_secret" in str(err.value) and "task.judge.api_key_env" in str(err.value)
    with pytest.raises(ConfigError) as err:
        _proof_config({"judge_secret": {"name": "Not_A_Name", "key": "api-key"}})
    assert "cluster.judge_secret.name" in str(err.value)


def test_cluster_section_errors_name_the_field():
    cases = {
        "cluster.gpu.tolerations.0.value": {"gpu": {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}},
        "cluster.gpu.node_selector": {"gpu": {"node_selector": {"not a label": "x"}}},
        "cluster.tasks.memory_request": {"tasks": {"memory_request": "16GB"}},
        "cluster.gpu.accelerator_count": {"gpu": {"accelerator_count": -1}},
        "cluster.gpu.stages.0": {"gpu": {"stages": ["train"]}},
        "cluster.s3_secret": {"s3_secret": "Not_A_Name"},
        "cluster.s3_endpoint_url": {"s3_endpoint_url": "http://user:pw@minio:9000"},
        "cluster.gpu.shm": {"gpu": {"shm": "1Gi"}},
    }
    for field, section in cases.items():
        with pytest.raises(ConfigError) as err:
            parse_config({"cluster": section})
        assert field in str(err.value), (field, str(err.value))
        assert "pw@" not in str(err.value)


# --- README: Run on Kubeflow ---------------------------------------------------------


def readme_commands() -> list[str]:
    """The commands of the fenced blocks in README's "Run on Kubeflow" section, continuations joined."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Run on Kubeflow\n", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"^```(?:sh|bash|console)?\n(.*?)^```", section, re.M | re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def shell_words(command: str) -> list[str]:
    """The words bash passes for ``command`` (with ``$(...)`` expanded, run from the repository root)."""
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {command}"], cwd=ROOT, capture_output=True, check=True)
    return out.stdout.decode().split("\0")[:-1]


def _check_docker(words: list[str]) -> None:
    match words:
        case ["docker", "build", "-f", dockerfile, "-t", tag, "."]:
            assert image.DOCKERFILES[tag] == dockerfile
        case ["docker", "push", tag]:
            assert tag in image.DOCKERFILES
        case _:
            raise AssertionError(f"unchecked docker command {words}")


def _check_kubectl(words: list[str], k8s_copy: Path) -> None:
    match words:
        case ["kubectl", "apply", "-k", folder] | ["kubectl", "kustomize", folder]:
            assert folder.startswith("k8s/overlays/") and Path(ROOT, folder).is_dir()
            for obj in render(k8s_copy.parent / folder):
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        case ["kubectl", "-n", namespace, "port-forward", service, ports]:
            # the namespace local-dev puts everything in; the services KFP ships
            assert namespace == "kubeflow" and service in {"svc/ml-pipeline-ui", "svc/minio-service"}
            assert re.match(r"^\d+:\d+$", ports)
        case _:
            raise AssertionError(f"unchecked kubectl command {words}")


def test_every_readme_cluster_command_is_checked(k8s_copy, capsys):
    from pipelines.cli import main

    commands = readme_commands()
    programs = {shlex.split(c)[0] for c in commands}
    assert {"docker", "cp", "kubectl", ".venv/bin/ac2", "set"} <= programs, programs
    submitted = []
    for command in commands:
        first = shlex.split(command)[0]
        if first == "docker":
            _check_docker(shlex.split(command))
        elif first == "kubectl":
            _check_kubectl(shlex.split(command.rstrip("& ")), k8s_copy)
        elif first == "cp":
            assert shlex.split(command) == ["cp", "k8s/base/s3-credentials.env.template", "k8s/base/s3-credentials.env"]
        elif first == "set":  # set -a; . FILE; set +a: the same credentials for the submitting machine
            (sourced,) = re.findall(r"\. ([^\s;]+)", command)
            assert sourced == "k8s/base/s3-credentials.env"
        elif first == "export":
            name, _, value = shlex.split(command)[1].partition("=")
            assert name == "AWS_ENDPOINT_URL_S3" and name in (ROOT / "ac2_core" / "storage" / "uris.py").read_text()
            assert re.match(r"^http://localhost:\d+$", value)
        elif first == ".venv/bin/ac2":
            words = shell_words(command)[1:]
            assert words[0] == "submit" and "--pipeline-root" in words
            argv = words if "--dry-run" in words else [*words, "--dry-run"]
            assert main(argv) == 0, command
            planned = [yaml.safe_load(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
            root = words[words.index("--pipeline-root") + 1]
            assert planned and {p["pipeline_root"] for p in planned} == {root}
            submitted.append(root)
        else:
            raise AssertionError(f"README command not checked by any test: {command}")
    # every pipeline root submitted to is an s3:// root some overlay's launcher is configured for
    launcher_roots = {_by_kind(render(k8s_copy / "overlays" / o))["ConfigMap"]["data"]["defaultPipelineRoot"] for o in OVERLAYS}
    assert submitted and set(submitted) <= launcher_roots
