"""The rubric judge (ac2_core.tasks.judge): score parsing, and HTTP against a real server on loopback."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ac2_core.config import JudgeConfig
from ac2_core.tasks.judge import JudgeItem, RubricJudge, ScoreParseError, build_messages, parse_score

# ---------------------------------------------------------------------- parsing

GOOD = [
    ("The proof is complete and rigorous.\n<score>7</score>", 7),
    ("Steps 1-3 are fine, step 4 has a gap.\n\n<score> 4 </score>", 4),
    ("Checkpoint 1 (2 pts): met. Checkpoint 2 (5 pts): not met.\nScore: 2/7", 2),
    ("**Final score: 5**", 5),
    ("Initially I thought Score: 3, but on reflection the lemma holds.\nFinal score: 6", 6),  # final label wins
    ("The grade is therefore\n\n**0**", 0),
    ("Overall this deserves 7/7.", 7),
    ("Grade: 1 out of 7", 1),
    (r"$\boxed{3}$", 3),
    ("5", 5),
    ("The candidate proves cases n=1 and n=2 only.\nI award 1", 1),  # last line, one number
    ("<SCORE>6</SCORE> as argued above, the 3 steps hold", 6),  # the tag beats stray numbers
    ("<score>7.0</score>", 7),
]
BAD = [
    ("", "empty reply"),
    ("   \n  ", "empty reply"),
    ("I'm sorry, but I can't help with grading this.", "no score found"),
    ("<score>9</score>", "outside 0..7"),
    ("Score: 9/10", "out of 10"),
    ("<score>3</score> ... wait, <score>5</score>", "ambiguous"),
    ("Score: 4.5/7", "not a whole number"),
    ("Steps 2 and 5 fail", "ambiguous"),
    ("<score>-1</score>", "outside 0..7"),
    ("The final answer is 12 and 13", "ambiguous"),
]


@pytest.mark.parametrize(("reply", "points"), GOOD)
def test_parse_score(reply, points):
    assert parse_score(reply) == points


@pytest.mark.parametrize(("reply", "why"), BAD)
def test_parse_score_refuses(reply, why):
    with pytest.raises(ScoreParseError, match=why):
        parse_score(reply)


def test_prompt_holds_every_part():
    item = JudgeItem(problem="P?", proof="Q.E.D.", rubrics=["lemma", "finish"], guidelines="G", reference_solution="R")
    user = build_messages(item)[1]["content"]
    for part in ("P?", "Q.E.D.", "1. lemma", "2. finish", "G", "## Reference solution\nR"):
        assert part in user
    assert "Reference solution" not in build_messages(JudgeItem(problem="P", proof="x"))[1]["content"]


# ---------------------------------------------------------------------- HTTP


class _Handler(BaseHTTPRequestHandler):
    """Routes by the first path segment: /ok, /slow, /flaky (500 twice), /garbage, /http500, /auth, /bad."""

    calls: dict[str, int] = {}
    lock = threading.Lock()
    seen_auth: list[str | None] = []

    def log_message(self, *args):  # keep test output clean
        pass

    def do_POST(self):
        route = self.path.split("/")[1]
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            n = self.calls[route] = self.calls.get(route, 0) + 1
            self.seen_auth.append(self.headers.get("Authorization"))
        proof = body["messages"][1]["content"].split("## Candidate proof\n")[1].split("\n")[0]
        match route:
            case "slow":
                time.sleep(1.0)  # past the client's timeout
                return self._reply("<score>7</score>")
            case "flaky" if n <= 2:
                return self._status(500)
            case "garbage":
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(b"<html>bad gateway</html>")
                return
            case "http500":
                return self._status(503)
            case "bad":
                return self._status(400)
        # derived reply: the proof text says which score to give, e.g. "proof-5"
        self._reply(f"Reviewed.\n<score>{proof.rsplit('-', 1)[-1]}</score>")

    def _status(self, code):
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _reply(self, text):
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # /slow: the client gave up waiting
            pass


@pytest.fixture
def server():
    _Handler.calls = {}
    _Handler.seen_auth = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.block_on_close = False  # the /slow handler may still be sleeping; it holds no resource
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def _judge(url, route, **kw):
    settings = dict(timeout_seconds=0.3, max_attempts=3, backoff_seconds=0.05, max_concurrency=4)
    return RubricJudge(JudgeConfig(base_url=f"{url}/{route}/v1", model="judge", **{**settings, **kw}))


def _items(*scores):
    return [JudgeItem(problem="Prove it.", proof=f"proof-{s}", rubrics=["all"]) for s in scores]


def test_scores_in_order_with_bounded_concurrency(server):
    start = time.monotonic()
    got = _judge(server, "ok").judge_many(_items(0, 7, 3, 5, 1, 6, 2, 4))
    assert [j.points for j in got] == [0, 7, 3, 5, 1, 6, 2, 4]
    assert [j.score for j in got] == pytest.approx([0, 1, 3 / 7, 5 / 7, 1 / 7, 6 / 7, 2 / 7, 4 / 7])
    assert all(j.error is None and j.attempts == 1 for j in got)
    assert _Handler.calls == {"ok": 8}
    assert time.monotonic() - start < 5


def test_unreadable_score_is_a_recorded_failure(server):
    (j,) = _judge(server, "ok").judge_many(_items(9))  # the server answers <score>9</score>
    assert j.score is None and j.points is None and "outside 0..7" in j.error and "<score>9</score>" in j.raw
    assert j.attempts == 1  # not retried: the same reply would come again


def test_timeout_is_retried_then_recorded(server):
    start = time.monotonic()
    j = _judge(server, "slow", max_attempts=2).judge(_items(3)[0])
    elapsed = time.monotonic() - start
    assert j.score is None and "gave up after 2 attempts" in j.error and "within 0.3 s" in j.error
    assert j.attempts == 2 and _Handler.calls["slow"] == 2
    assert 0.6 <= elapsed < 2.0  # two 0.3 s timeouts and a 0.05 s backoff, not the server's 1 s sleeps


def test_500s_then_success(server):
    j = _judge(server, "flaky").judge(_items(5)[0])
    assert j.points == 5 and j.error is None and j.attempts == 3 and _Handler.calls["flaky"] == 3


@pytest.mark.parametrize(("route", "why"), [("garbage", "malformed response"), ("http500", "HTTP 503")])
def test_persistent_failures_are_bounded(server, route, why):
    start = time.monotonic()
    j = _judge(server, route).judge(_items(5)[0])
    assert j.score is None and why in j.error and j.attempts == 3 and _Handler.calls[route] == 3
    assert time.monotonic() - start < 1.5  # backoff 0.05 + 0.1


def test_client_error_is_not_retried(server):
    j = _judge(server, "bad").judge(_items(5)[0])
    assert j.score is None and "HTTP 400" in j.error and j.attempts == 1


def test_unreachable_endpoint(server):
    judge = RubricJudge(
        JudgeConfig(base_url="http://127.0.0.1:1/v1", model="judge", max_attempts=2, backoff_seconds=0.01, timeout_seconds=0.5)
    )
    j = judge.judge(_items(5)[0])
    assert j.score is None and "cannot reach" in j.error and j.attempts == 2


def test_api_key_from_the_named_variable(server, monkeypatch):
    monkeypatch.setenv("AC2_TEST_JUDGE_KEY", "sekrit-123")
    judge = _judge(server, "ok", api_key_env="AC2_TEST_JUDGE_KEY")
    assert judge.judge(_items(4)[0]).points == 4
    assert _Handler.seen_auth == ["Bearer sekrit-123"]
    assert "sekrit" not in repr(judge)


def test_api_key_variable_unset(monkeypatch):
    monkeypatch.delenv("AC2_TEST_JUDGE_KEY", raising=False)
    with pytest.raises(ValueError, match="task.judge.api_key_env: environment variable AC2_TEST_JUDGE_KEY"):
        RubricJudge(JudgeConfig(base_url="http://127.0.0.1:1/v1", model="judge", api_key_env="AC2_TEST_JUDGE_KEY"))
