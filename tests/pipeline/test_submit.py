"""``ac2 submit`` against a stand-in KFP API server on 127.0.0.1.

The server answers the v2beta1 endpoints that ``kfp.Client`` calls, records every
request, and plays the cluster's launcher: when a run is created it publishes that run's
outputs under ``<pipeline_root>/<pipeline name>/<run id>/<task>/<salt>/<output>``
(copied from the finished kfp.local run), and reports the run SUCCEEDED (or FAILED).
"""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest

from ac2_core.runner import inprocess
from pipelines.cli import main
from tests.conftest import tiny_config
from tests.pipeline.conftest import config_file

SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "test-secret-key-must-not-leak-3b1f",
    "AWS_ACCESS_KEY_ID": "TESTACCESSKEYMUSTNOTLEAK",
    "KF_PIPELINES_SA_TOKEN_PATH": "/nonexistent/token-must-not-leak",
}


class FakeKFP:
    """The API server and the launcher of a pretend cluster."""

    def __init__(self, pipeline_root: Path, layout, *, fail_run: int | None = None):
        self.root, self.layout, self.fail_run = pipeline_root, layout, fail_run
        self.requests: list[tuple[str, str, dict | None]] = []
        self.runs: dict[str, dict] = {}
        self.experiments: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def _reply(self, body: dict, status: int = 200):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                fake.requests.append(("GET", self.path, None))
                path = urlparse(self.path).path
                if path == "/apis/v2beta1/healthz":
                    return self._reply({"multi_user": False})
                if path == "/apis/v2beta1/experiments":  # the client looks it up by name, then creates it
                    return self._reply(
                        {"experiments": fake.experiments, "total_size": len(fake.experiments)} if fake.experiments else {}
                    )
                if path.startswith("/apis/v2beta1/runs/"):
                    return self._reply(fake.runs[path.rsplit("/", 1)[-1]])
                self._reply({"error": f"unexpected GET {path}"}, 404)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                fake.requests.append(("POST", self.path, body))
                path = urlparse(self.path).path
                if path == "/apis/v2beta1/experiments":
                    fake.experiments.append(
                        {"experiment_id": f"exp-{len(fake.experiments) + 1}", "display_name": body["display_name"]}
                    )
                    return self._reply(fake.experiments[-1])
                if path == "/apis/v2beta1/runs":
                    return self._reply(fake.create_run(body))
                self._reply({"error": f"unexpected POST {path}"}, 404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # a free port
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def create_run(self, body: dict) -> dict:
        n = len(self.runs)
        run_id = f"run-{n}"
        pipeline = body["pipeline_spec"]["pipelineInfo"]["name"]
        ok = n != self.fail_run
        if ok:  # the launcher's output layout, with a salt level as in KFP >= 2.4
            calls = inprocess.stage_calls(tiny_config(), self.layout, min(n, 2))  # n = 0: the bootstrap
            for name, uri in (o for c in calls for o in c.outputs.items()):
                shutil.copytree(uri, self.root / pipeline / run_id / f"task-{name}" / "salt-9" / f"out_{name}")
        details = [{"display_name": "update_actor", "state": "SUCCEEDED" if ok else "FAILED"}]
        self.runs[run_id] = {
            "run_id": run_id,
            "display_name": body["display_name"],
            "state": "SUCCEEDED" if ok else "FAILED",
            "run_details": {"task_details": details},
        }
        return {"run_id": run_id, "display_name": body["display_name"], "state": "PENDING"}

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def created_runs(self) -> list[dict]:
        return [body for method, path, body in self.requests if method == "POST" and urlparse(path).path == "/apis/v2beta1/runs"]


@pytest.fixture
def secrets_in_env(monkeypatch):
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)


def test_submit_chains_runs_through_the_api(kfp_run, kfp_layout, tmp_path, secrets_in_env, capsys):
    cfg, _, _, _ = kfp_run
    root = tmp_path / "pipeline-root"
    argv = [
        "submit",
        "--config",
        str(config_file(cfg, tmp_path)),
        "--experiment",
        "ac2-tests",
        "--pipeline-root",
        str(root),
        "--timeout",
        "60",
    ]
    with FakeKFP(root, kfp_layout) as fake:
        assert main([*argv[:1], "--host", fake.url, *argv[1:]]) == 0
    runs = fake.created_runs()
    assert [r["display_name"] for r in runs] == [
        f"ac2-{cfg.run_id}-bootstrap",
        f"ac2-{cfg.run_id}-iter-1",
        f"ac2-{cfg.run_id}-iter-2",
    ]
    assert [r["pipeline_spec"]["pipelineInfo"]["name"] for r in runs] == ["ac2-bootstrap", "ac2-iteration", "ac2-iteration"]
    assert all(r["experiment_id"] == "exp-1" and r["runtime_config"]["pipeline_root"] == str(root) for r in runs)
    experiments = [b for m, p, b in fake.requests if m == "POST" and p.startswith("/apis/v2beta1/experiments")]
    assert [e["display_name"] for e in experiments] == ["ac2-tests"]
    params = [r["runtime_config"]["parameters"] for r in runs]
    assert all(p["config_json"] == cfg.to_json() for p in params)
    assert [p.get("iteration") for p in params] == [None, 1, 2]
    # each run imports what the run before it published, found under the pipeline root
    published = lambda n, name: str(
        root / ("ac2-bootstrap" if n == 0 else "ac2-iteration") / f"run-{n}" / f"task-{name}" / "salt-9" / f"out_{name}"
    )  # noqa: E731
    assert params[1]["actor_uri"] == published(0, "actor")
    assert params[1]["critic_uri"] == published(0, "critic")
    assert params[2]["actor_uri"] == published(1, "actor")
    assert params[2]["metrics_uri"] == published(1, "metrics")
    assert params[2]["problems_uri"] == published(0, "problems")
    assert params[2]["reference_uri"] == published(0, "actor")
    # caching is off for every task, and no credential reaches the cluster
    for r in runs:
        assert all(
            t.get("cachingOptions", {}).get("enableCache") is not True
            for t in r["pipeline_spec"]["root"]["dag"]["tasks"].values()
        )
    sent = json.dumps([body for _, _, body in fake.requests])
    for value in SECRETS.values():
        assert value not in sent
    assert not any(key in sent for key in SECRETS)


def test_submit_reports_a_failed_run_in_one_line(kfp_run, kfp_layout, tmp_path, capsys):
    cfg, _, _, _ = kfp_run
    root = tmp_path / "pipeline-root"
    with FakeKFP(root, kfp_layout, fail_run=1) as fake:
        rc = main(
            [
                "submit",
                "--host",
                fake.url,
                "--config",
                str(config_file(cfg, tmp_path)),
                "--pipeline-root",
                str(root),
                "--timeout",
                "60",
            ]
        )
    assert rc == 1
    err = capsys.readouterr().err.strip()
    assert err == f"ac2: run ac2-{cfg.run_id}-iter-1 (run-1) ended FAILED; failed: update_actor"
    assert len(fake.created_runs()) == 2  # nothing is submitted after a failure


def test_dry_run_sends_nothing(tmp_path, capsys):
    cfg = tiny_config(algorithm="grpo")
    with FakeKFP(tmp_path, None) as fake:
        assert main(["submit", "--host", fake.url, "--config", str(config_file(cfg, tmp_path)), "--dry-run"]) == 0
    assert fake.requests == []
    planned = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [p["run_name"] for p in planned] == [
        f"ac2-{cfg.run_id}-bootstrap",
        f"ac2-{cfg.run_id}-iter-1",
        f"ac2-{cfg.run_id}-iter-2",
    ]
    # grpo never updates the critic: every iteration imports the bootstrap's
    assert {p["arguments"]["critic_uri"] for p in planned[1:]} == {f"<ac2-{cfg.run_id}-bootstrap:critic>"}
    assert planned[2]["arguments"]["actor_uri"] == f"<ac2-{cfg.run_id}-iter-1:actor>"
