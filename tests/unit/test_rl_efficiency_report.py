"""The central experiment's measurement (bench/rl_efficiency.py): the moving-average curve,
GRPO's peak, the decode FLOPs ratio where a run first reaches it, the bound a run that never
does gets, the ratios at GRPO's earlier scores, and the bootstrap interval of the median."""

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "rl_efficiency.py"
_spec = importlib.util.spec_from_file_location("rl_efficiency", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def run(
    vals: dict[int, float], flops_per_iteration: float, iterations: int, *, eval_s: float = 1.0, tokens_per_iteration: int = 0
) -> list[dict]:
    """Records of one run: iteration 0 (the initial policy) to ``iterations``, validation at the
    iterations ``vals`` names, 10 s of wall (and of CPU) an iteration, ``eval_s`` of it evaluating
    where there is a score."""
    recs = []
    for it in range(iterations + 1):
        score = vals.get(it)
        recs.append(
            {
                "iteration": it,
                "val_score": score,
                "cum_decode_flops": flops_per_iteration * it,
                "cum_decode_tokens": tokens_per_iteration * it,
                "wall_s": 10.0,
                "cpu_s": 10.0,
                "eval_s": eval_s if score is not None else 0.0,
            }
        )
    return recs


def test_the_curve_averages_the_last_evaluations_and_leaves_out_the_initial_score_and_evaluation_time():
    recs = run({0: 0.9, 2: 0.2, 4: 0.4, 6: 0.9}, flops_per_iteration=5.0, iterations=6, eval_s=4.0)
    points = bench.curve(recs, window=2)
    assert [p["iteration"] for p in points] == [4, 6]  # the first point needs two evaluations; iteration 0 is not one
    assert [p["ma"] for p in points] == pytest.approx([0.3, 0.65])
    assert [p["flops"] for p in points] == [20.0, 30.0]
    # 10 s a record, less 4 s on each record with a score (iteration 0's included): 38 s to iteration 4, 54 s to 6
    assert [p["wall"] for p in points] == pytest.approx([38.0, 54.0])
    assert [p["cpu"] for p in points] == pytest.approx([38.0, 54.0])


def test_a_run_that_reaches_grpos_peak_is_measured_where_it_first_does():
    grpo = run({2: 0.3, 4: 0.5, 6: 0.6, 8: 0.55}, flops_per_iteration=4.0, iterations=8)
    cheap = run({2: 0.4, 4: 0.6, 6: 0.7, 8: 0.7}, flops_per_iteration=1.0, iterations=8)
    peaks, ratios = bench.headline({("grpo", 0): grpo, ("ac2", 0): cheap}, window=1, reference="grpo")
    assert peaks[0]["peak"] == pytest.approx(0.6) and peaks[0]["iteration"] == 6
    # GRPO spent 24 to reach 0.6 at iteration 6; the cheap run reached it at 4, having spent 4
    assert ratios["ac2", 0]["reached"] and ratios["ac2", 0]["iteration"] == 4
    assert ratios["ac2", 0]["flops_ratio"] == pytest.approx(6.0)
    assert ratios["grpo", 0]["flops_ratio"] == pytest.approx(1.0)


def test_a_run_that_never_reaches_the_peak_is_bounded_by_its_whole_runs_cost():
    grpo = run({2: 0.3, 4: 0.6}, flops_per_iteration=4.0, iterations=4)
    short = run({2: 0.5, 4: 0.59, 6: 0.58}, flops_per_iteration=1.0, iterations=6)
    _, ratios = bench.headline({("grpo", 0): grpo, ("ac2", 0): short}, window=1, reference="grpo")
    miss = ratios["ac2", 0]
    assert not miss["reached"] and miss["iteration"] is None
    assert miss["flops_ratio"] == pytest.approx(16.0 / 6.0)  # GRPO's 16 against all 6 the run spent, a bound from above
    assert miss["best"] == pytest.approx(0.59)


def test_a_seed_without_its_grpo_run_has_no_ratio():
    grpo = run({2: 0.6}, flops_per_iteration=4.0, iterations=2)
    other_seed = run({2: 0.7}, flops_per_iteration=1.0, iterations=2)
    _, ratios = bench.headline({("grpo", 0): grpo, ("ac2", 1): other_seed}, window=1, reference="grpo")
    assert ("ac2", 1) not in ratios


def test_the_milestones_are_grpos_scores_part_way_through_its_run_at_its_own_first_cost():
    # GRPO's score at 50% of its 8 iterations is 0.5 (iteration 4), first reached at iteration 2 for 8 FLOPs
    grpo = run({2: 0.5, 4: 0.5, 6: 0.6, 8: 0.7}, flops_per_iteration=4.0, iterations=8)
    cheap = run({2: 0.3, 4: 0.5, 6: 0.55, 8: 0.65}, flops_per_iteration=1.0, iterations=8)
    out = bench.milestone_ratios({("grpo", 0): grpo, ("ac2", 0): cheap}, window=1, reference="grpo", fractions=(0.5, 1.0))
    assert out["grpo", 0] == pytest.approx([1.0, 1.0])
    half, whole = out["ac2", 0]
    assert half == pytest.approx(8.0 / 4.0)  # reached 0.5 at iteration 4 for 4 FLOPs
    assert whole is None  # never reached 0.7


def test_the_bootstrap_interval_of_the_median_lies_within_the_seeds_and_holds_their_median():
    values = [2.1, 2.6, 3.0, 3.4, 3.9]
    lo, hi = bench.bootstrap_ci(values, resamples=2000)
    assert min(values) <= lo <= 3.0 <= hi <= max(values) and lo < hi
    assert bench.bootstrap_ci([2.5] * 5, resamples=200) == (2.5, 2.5)
    assert bench.bootstrap_ci(values, resamples=2000) == (lo, hi)  # seeded: the same interval again


def test_the_standard_error_of_an_evaluation_is_binomial():
    assert bench.eval_standard_error(0.5, 2500) == pytest.approx(0.01)
    assert bench.eval_standard_error(0.0, 100) == 0.0


def test_a_reference_budget_says_what_share_of_grpos_decoding_the_longest_other_run_spent():
    from argparse import Namespace

    runs = {
        ("grpo", 0): run({2: 0.6}, flops_per_iteration=4.0, iterations=2, tokens_per_iteration=400),
        ("ac2", 0): run({2: 0.5, 4: 0.6}, flops_per_iteration=1.0, iterations=4, tokens_per_iteration=100),
        # within the budget: not counted
        ("grpo_skip", 0): run({2: 0.5}, flops_per_iteration=4.0, iterations=2, tokens_per_iteration=400),
    }
    assert bench.budget_note(runs, Namespace(reference="grpo", reference_iterations=None)) == []
    note = " ".join(bench.budget_note(runs, Namespace(reference="grpo", reference_iterations=2)))
    assert "cut at iteration 2" in note and "at most 0.50 of GRPO's budget" in note  # 400 tokens against 800


def full_run(variant: str, seed: int, vals: dict[int, float], flops_per_iteration: float, iterations: int) -> list[dict]:
    """``run``'s records with every field the report reads, as the bench writes them."""
    recs = run(vals, flops_per_iteration, iterations, tokens_per_iteration=int(flops_per_iteration))
    for r in recs:
        r.update(
            variant=variant, seed=seed, readiness_share=0.0, chunk_groups=0, full_groups=4, critic_error=None,
            cum_critic_flops=0.0, cum_train_flops=0.0, decode_tokens=int(flops_per_iteration), critic_auc=None,
            full_rollout_tokens=None, stage_s={},
        )  # fmt: skip
    return recs


def write_run(out: Path, recs: list[dict]) -> None:
    path = out / f"seed{recs[0]['seed']}" / recs[0]["variant"] / "records.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_a_report_archives_its_runs_and_a_fresh_clone_rebuilds_it_from_the_archive(tmp_path, monkeypatch):
    out, archive, results = tmp_path / "runs" / "rl", tmp_path / "archive", tmp_path / "rl.md"
    write_run(out, full_run("grpo", 0, {0: 0.2, 2: 0.3, 4: 0.6}, flops_per_iteration=4.0, iterations=4))
    write_run(out, full_run("ac2", 0, {0: 0.2, 2: 0.6, 4: 0.7}, flops_per_iteration=1.0, iterations=4))
    argv = ["--report-only", "--variants", "grpo", "ac2", "--seeds", "0", "--set", "run.iterations=4", "--smooth", "1"]
    argv += ["--out", str(out), "--archive", str(archive), "--results", str(results)]
    monkeypatch.setattr(bench, "plot", lambda *a, **k: None)  # matplotlib is beside the point

    bench.main(argv)
    first = results.read_text()
    assert "s0: 8.00 @ 2" in first  # GRPO's 0.6 cost it 16 FLOPs; AC2 reached it at iteration 2 for 2
    entry = json.loads((archive / "rl" / "seed0" / "ac2.json").read_text())
    assert [r["val_score"] for r in entry["records"]] == [0.2, None, 0.6, None, 0.7]

    shutil.rmtree(out)  # a fresh clone: bench/runs is not committed
    bench.main(argv)
    rebuilt = results.read_text()
    strip = lambda text: [line for line in text.splitlines() if "load average" not in line]  # noqa: E731
    assert strip(rebuilt) == strip(first)


def test_a_run_that_disagrees_with_its_archive_is_kept_and_reported(capsys):
    archived = {("ac2", 0): {"records": full_run("ac2", 0, {2: 0.6, 4: 0.7}, 1.0, 4), "diagnostics": {}}}
    shorter = full_run("ac2", 0, {2: 0.6}, 1.0, 2)
    assert bench.merge_runs({("ac2", 0): shorter}, archived)["ac2", 0] == archived["ac2", 0]["records"]  # a rerun under way
    other = full_run("ac2", 0, {2: 0.5}, 1.0, 2)
    assert bench.merge_runs({("ac2", 0): other}, archived)["ac2", 0] == other
    assert "differ from the archive's from iteration 2" in capsys.readouterr().out


def test_a_damaged_archive_is_named(tmp_path):
    (tmp_path / "seed0").mkdir()
    (tmp_path / "seed0" / "ac2.json").write_text('{"records": [')
    with pytest.raises(SystemExit, match="ac2.json: not an archived run"):
        bench.load_archive(tmp_path)


def test_a_run_stopped_before_its_first_iteration_is_left_out_of_the_report(tmp_path, monkeypatch, capsys):
    out, results = tmp_path / "runs" / "rl", tmp_path / "rl.md"
    write_run(out, full_run("grpo", 0, {0: 0.2, 2: 0.3, 4: 0.6}, flops_per_iteration=4.0, iterations=4))
    write_run(out, full_run("ac2", 0, {0: 0.2, 2: 0.6, 4: 0.7}, flops_per_iteration=1.0, iterations=4))
    write_run(out, full_run("grpo", 1, {0: 0.2}, flops_per_iteration=4.0, iterations=0))  # killed at its start
    (out / "seed1" / "grpo" / "iter-0001").mkdir()  # with half an iteration's artifacts
    monkeypatch.setattr(bench, "plot", lambda *a, **k: None)
    argv = ["--report-only", "--set", "run.iterations=4", "--smooth", "1", "--out", str(out)]
    bench.main([*argv, "--archive", str(tmp_path / "archive"), "--results", str(results)])
    assert "no iteration recorded yet: grpo seed 1" in capsys.readouterr().out
    assert "s0: 8.00 @ 2" in results.read_text() and "s1:" not in results.read_text()


def test_the_archive_is_committed_not_ignored_as_the_run_folders_are():
    root = Path(bench.ROOT)
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    probe = bench.archive_path(bench.ARCHIVE / "rl", "grpo", 0).relative_to(root)
    ignored = subprocess.run(["git", "check-ignore", "-q", str(probe)], cwd=root).returncode == 0
    assert not ignored, f"{probe} is git-ignored: archived runs would be lost with the machine"


def test_the_fork_diagnostic_reads_only_the_iterations_a_run_under_way_has_completed(tmp_path, monkeypatch):
    # a full invocation reports every run under --out, another invocation's included: one of them at
    # its first iteration must not be read at iterations 2-4, whose artifacts are still being written
    from ac2_core import storage
    from ac2_core.models import tokenizer
    from ac2_core.runner.layout import RunLayout

    read = []

    def read_rows(uri, kind):
        read.append((kind, uri))
        return [{"problem_id": "p0", "prompt": "1+2="}] if kind == "problems" else []

    monkeypatch.setattr(storage, "read_rows", read_rows)
    monkeypatch.setattr(tokenizer, "load_tokenizer", lambda uri: None)
    monkeypatch.setattr(bench, "worked_solution", lambda layout: lambda pid, ids: True)
    monkeypatch.setattr(RunLayout, "completed_iterations", lambda self: 1)

    bench.fork_choices(tmp_path, [7])
    layout = RunLayout(str(tmp_path))
    assert [uri for kind, uri in read if kind == "scored_chunks"] == [layout.output(1, "scored_chunks")] * 2  # start, end
