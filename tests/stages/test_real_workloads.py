"""Real workloads through the pipeline on the tiny model: a FineProofs-RL file graded by a
rubric judge served on loopback, a judge that fails, and a final-answer math file."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ac2_core import storage
from ac2_core.runner import inprocess
from ac2_core.runner.layout import RunLayout
from ac2_core.stages.check_readiness import advantages
from tests.conftest import tiny_config

RUBRIC = "Shows 2k + 2k = 2(2k) (7 pts)"


class JudgeHandler(BaseHTTPRequestHandler):
    """An OpenAI-compatible /v1/chat/completions. ``mode``: ok (a score read off the proof's
    length), garbage (a reply with no score), slow (no reply within the client's timeout),
    mixed (garbage for proofs of even length, a score otherwise)."""

    mode = "ok"
    requests: list[dict] = []
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_POST(self):
        if self.path != "/v1/chat/completions":
            self.send_response(404)
            self.end_headers()
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.requests.append(body)
        proof = body["messages"][1]["content"].split("## Candidate proof\n", 1)[1]
        match self.mode:
            case "slow":
                time.sleep(1.0)
                text = "<score>7</score>"
            case "garbage":
                text = "I am unable to grade this submission."
            case "mixed" if len(proof) % 2 == 0:
                text = "Scores 3 and 5 both apply."  # two numbers on the last line: unreadable
            case _:
                text = f"The argument is incomplete.\n\nFinal score: {len(proof) % 8}/7"
        data = json.dumps(
            {"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data.encode())
        except (BrokenPipeError, ConnectionResetError):  # a 'slow' reply to a client that gave up
            pass


@pytest.fixture
def judge_url():
    JudgeHandler.mode = "ok"
    JudgeHandler.requests = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), JudgeHandler)  # port 0: a free port
    httpd.block_on_close = False  # a 'slow' handler may still sleep; it holds nothing
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def fineproofs_file(tmp_path) -> str:
    """A FineProofs-RL-shaped Parquet file: every column of the data set, rubrics as lists."""
    rows = [
        {
            "problem": f"Prove that {i}+{i} is even.",
            "source": "olympiads",
            "rubrics": [RUBRIC, f"Case {i} handled (0 pts)"],
            "scores": [7, 0, 3],
            "rewards": [1.0, 0.0, 3 / 7],
            "num_rewards": 3,
            "reward_mean": 0.48,
            "reward_std": 0.41,
        }
        for i in range(16)
    ]
    path = tmp_path / "fineproofs-rl.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def proof_config(tmp_path, url, task=(), **judge):
    task = {"name": "proof", "data": fineproofs_file(tmp_path), "shape": "fineproofs", "val_fraction": 0.25, **dict(task)}
    task["judge"] = {"base_url": url, "model": "tiny-judge", "timeout_seconds": 5, "backoff_seconds": 0.01, **judge}
    return tiny_config(run__iterations=1, **{f"task__{k}": v for k, v in task.items()})


def tables(out, name):
    return storage.read_rows(RunLayout(str(out)).output(1, name), kind=name)


def test_fineproofs_iteration_through_the_rubric_judge(tmp_path, judge_url):
    out = tmp_path / "run"
    initial, metrics = inprocess.run(proof_config(tmp_path, judge_url), str(out), log=lambda _: None)
    assert metrics["iteration"] == 1 and metrics["ungraded_chunks"] == 0 and metrics["ungraded_val"] == 0
    assert metrics["val_score"] is not None and initial["val_score"] is not None

    problems = storage.read_rows(RunLayout(str(out)).bootstrap("problems"), kind="problems")
    assert {p["task"] for p in problems} == {"proof"} and {p["split"] for p in problems} == {"train", "val"}
    assert all(json.loads(p["metadata"])["rubrics"][0] == RUBRIC for p in problems)

    scored = tables(out, "scored_chunks")
    finished = [s for s in scored if s["finished"]]
    assert finished, "the tiny model finished no answer within 32 tokens"
    # every finished chunk was judged and got points / 7 as its reward and target
    assert all(s["target_source"] == "reward" and s["grade_error"] is None for s in finished)
    assert all(s["target"] == s["reward"] and round(s["reward"] * 7, 4) in range(8) for s in finished)
    # one request per finished chunk and per validation answer (bootstrap and iteration 1),
    # each with the problem's rubric
    n_val = sum(p["split"] == "val" for p in problems)
    assert len(JudgeHandler.requests) == len(finished) + 2 * n_val
    assert all(RUBRIC in r["messages"][1]["content"] and r["model"] == "tiny-judge" for r in JudgeHandler.requests)
    assert {a["weight"] for a in tables(out, "advantages")} <= {0.0, 1.0}


def test_validation_on_a_proofbench_file_is_judged_by_its_guidelines(tmp_path, judge_url):
    guide = "7 points: writes n*2 as 2n. 0 otherwise."
    bench = [
        {
            "Problem ID": f"PB-{i}",
            "Problem": f"Show that {i}*2 is even.",
            "Solution": f"It is 2*{i}.",
            "Grading guidelines": guide,
        }
        for i in range(3)
    ]
    path = tmp_path / "proofbench.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in bench))
    task = {"val_data": str(path), "val_shape": "proofbench", "val_fraction": 0}
    out = tmp_path / "run"
    initial, metrics = inprocess.run(proof_config(tmp_path, judge_url, task=task), str(out), log=lambda _: None)
    assert initial["val_score"] is not None and metrics["val_score"] is not None and metrics["ungraded_val"] == 0

    problems = storage.read_rows(RunLayout(str(out)).bootstrap("problems"), kind="problems")
    assert [p["problem_id"] for p in problems if p["split"] == "val"] == ["PB-0", "PB-1", "PB-2"]
    assert sum(p["split"] == "train" for p in problems) == 16
    # validation answers (bootstrap and iteration 1, one sample each) go with the guidelines
    # and the reference solution; training chunks with their rubrics
    prompts = [r["messages"][1]["content"] for r in JudgeHandler.requests]
    guided = [p for p in prompts if guide in p]
    assert len(guided) == 6 and all(re.search(r"## Reference solution\nIt is 2\*\d\.", p) for p in guided)
    assert all(RUBRIC in p for p in prompts if guide not in p)


@pytest.mark.parametrize("mode", ["garbage", "slow"])
def test_failed_judgements_are_recorded_and_masked_not_scored(tmp_path, judge_url, mode):
    JudgeHandler.mode = mode
    cfg = proof_config(tmp_path, judge_url, timeout_seconds=0.3, max_attempts=2, max_concurrency=16)
    out, logs = tmp_path / "run", []
    initial, metrics = inprocess.run(cfg, str(out), log=logs.append)

    chunks, scored = tables(out, "chunks"), tables(out, "scored_chunks")
    assert [c["chunk_id"] for c in chunks] == [s["chunk_id"] for s in scored]  # nothing lost
    finished = [s for s in scored if s["finished"]]
    assert finished
    why = "unreadable score: no score found" if mode == "garbage" else "gave up after 2 attempts: no reply"
    for s in finished:
        assert s["reward"] is None and s["target"] is None and s["target_source"] == "ungraded"
        assert why in s["grade_error"]
    # masked downstream: no weight in the actor update, no pairs for the critic or readiness
    adv = {a["chunk_id"]: a for a in tables(out, "advantages")}
    assert all(adv[s["chunk_id"]]["weight"] == 0.0 and adv[s["chunk_id"]]["target"] is None for s in finished)
    assert not {p["trajectory_id"] for p in tables(out, "critic_pairs")} & {s["chunk_id"] for s in finished}
    # counted where a person looks, and no score is made up
    n_val = sum(p["split"] == "val" for p in storage.read_rows(RunLayout(str(out)).bootstrap("problems"), kind="problems"))
    assert metrics["ungraded_chunks"] == len(finished) and metrics["mean_train_reward"] is None
    assert metrics["ungraded_val"] == initial["ungraded_val"] == n_val
    assert metrics["val_score"] is None and initial["val_score"] is None
    assert any(f"ungraded: {len(finished)} chunks, {n_val} val" in line for line in logs)


def test_some_failed_judgements_leave_the_rest_of_the_batch_scored(tmp_path, judge_url):
    JudgeHandler.mode = "mixed"
    out = tmp_path / "run"
    _, metrics = inprocess.run(proof_config(tmp_path, judge_url), str(out), log=lambda _: None)
    finished = [s for s in tables(out, "scored_chunks") if s["finished"]]
    ungraded = [s for s in finished if s["grade_error"] is not None]
    graded = [s for s in finished if s["grade_error"] is None]
    assert ungraded and graded, "the fixture should fail some judgements and not others"
    assert all("unreadable score: last line: ambiguous" in s["grade_error"] and s["reward"] is None for s in ungraded)
    assert all(s["reward"] is not None and s["target_source"] == "reward" for s in graded)
    adv = {a["chunk_id"]: a for a in tables(out, "advantages")}
    assert {adv[s["chunk_id"]]["weight"] for s in ungraded} == {0.0}
    assert {p["trajectory_id"] for p in tables(out, "critic_pairs")} == {s["chunk_id"] for s in graded}
    assert metrics["ungraded_chunks"] == len(ungraded)
    assert metrics["mean_train_reward"] == pytest.approx(sum(s["reward"] for s in graded) / len(graded))


def test_a_missing_api_key_stops_the_run_before_anything_is_written(tmp_path, judge_url, monkeypatch):
    monkeypatch.delenv("AC2_TEST_JUDGE_KEY", raising=False)
    cfg = proof_config(tmp_path, judge_url, api_key_env="AC2_TEST_JUDGE_KEY")
    with pytest.raises(ValueError, match="task.judge.api_key_env: environment variable AC2_TEST_JUDGE_KEY is not set"):
        inprocess.run(cfg, str(tmp_path / "run"), log=lambda _: None)
    assert not JudgeHandler.requests
    assert not storage.exists(RunLayout(str(tmp_path / "run")).bootstrap("metrics"))


def test_math_final_answer_iteration(tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_text(
        "".join(
            json.dumps({"problem": f"{i}+{i}=?", "answer": str(2 * i), "solution": f"\\boxed{{{2 * i}}}"}) + "\n"
            for i in range(16)
        )
    )
    cfg = tiny_config(
        task__name="math", task__data=str(path), task__shape="final_answer", task__val_fraction=0.25, run__iterations=1
    )
    initial, metrics = inprocess.run(cfg, str(tmp_path / "run"), log=lambda _: None)
    assert metrics["iteration"] == 1 and 0 <= metrics["val_score"] <= 1 and metrics["ungraded_chunks"] == 0
    finished = [s for s in tables(tmp_path / "run", "scored_chunks") if s["finished"]]
    assert finished and {s["reward"] for s in finished} <= {0.0, 1.0}


def test_an_ungraded_chunk_leaves_its_group_baseline(tiny_cfg):
    # group p0: targets 1, 0, 0.5 graded and one ungraded chunk.
    # loo baselines over the three graded: (0+.5)/2=.25, (1+.5)/2=.75, (1+0)/2=.5
    # -> advantages .75, -.75, 0; the ungraded chunk: weight 0, advantage 0, no target.
    def row(i, target, source):
        return dict(
            run_id="r",
            iteration=1,
            policy_version=0,
            chunk_id=f"c{i}",
            prefix_id="p0",
            problem_id="x",
            target=target,
            target_source=source,
            value_start=0.5,
            mode="chunk",
        )

    scored = [row(0, 1.0, "reward"), row(1, None, "ungraded"), row(2, 0.0, "reward"), row(3, 0.5, "reward")]
    got = advantages(tiny_cfg, scored, ready=set())
    assert [a["chunk_id"] for a in got] == ["c0", "c1", "c2", "c3"]
    assert [a["advantage"] for a in got] == [0.75, 0.0, -0.75, 0.0]
    assert [a["baseline"] for a in got] == [0.25, 0.0, 0.75, 0.5]
    assert [a["weight"] for a in got] == [1.0, 0.0, 1.0, 1.0]
    assert got[1]["target"] is None
