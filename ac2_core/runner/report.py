"""What a run shows: a console row per iteration, the Markdown table, and the learning curve.

The console rows are printed by the iteration loop (both runners) and ``ac2 submit``; the
Markdown table is ``evaluate``'s KFP report, ``ac2 run``'s ``summary.md`` and part of
``ac2 report``, which adds the learning curves of one or more runs (validation score
against iterations and against cumulative decode FLOPs). Rows are those of the metrics
table (``schemas.METRICS``); ``SCALARS`` names its columns for the trackers.
"""

from __future__ import annotations

from pathlib import Path

# The critic's out-of-sample figures and the training statistics of a row, each with its console
# header and format and its Markdown header. Nullable: an iteration without the update (no trained
# row) or without pairs has none. The critic's AUC comes first, beside the tokens saved: users
# weigh AC2's savings against how far its critic can be trusted.
STATS = (
    ("critic_auc", "auc", "{:>5.3f}", "critic AUC"),
    ("critic_error", "calib", "{:>5.3f}", "calib. error"),
    ("actor_loss", "a_loss", "{:>7.4f}", "actor loss"),
    ("clip_fraction", "clip", "{:>5.3f}", "clip frac."),
    ("grad_norm", "gnorm", "{:>6.3f}", "grad norm"),
    ("kl", "kl", "{:>7.5f}", "KL"),
    ("entropy", "entropy", "{:>7.3f}", "entropy"),
    ("critic_loss", "c_loss", "{:>6.4f}", "critic loss"),
)
# decode tokens spent (dec_tok) against what full rollouts of the same problems would have decoded (full_tok)
HEADER = (
    f"{'iter':>5} {'val':>6} {'ready':>7} {'chunk/full':>11} {'dec_tok':>9} {'full_tok':>9} {'saved':>6} "
    + " ".join(f"{h:>{len(f.format(0.0))}}" for _, h, f, _ in STATS)
    + f" {'cum_dec_FLOPs':>13}"
)

# each metrics column as the trackers (TensorBoard, MLflow, KFP) name it: grouped by what it is about
SCALARS = {
    "val_score": "eval/val_score",
    "mean_train_reward": "train/mean_reward",
    "readiness_share": "readiness/share",
    "chunk_groups": "readiness/chunk_groups",
    "full_groups": "readiness/full_groups",
    "ungraded_chunks": "train/ungraded_chunks",
    "actor_loss": "actor/loss",
    "clip_fraction": "actor/clip_fraction",
    "grad_norm": "actor/grad_norm",
    "kl": "actor/kl",
    "entropy": "actor/entropy",
    "critic_loss": "critic/loss",
    "critic_auc": "critic/auc",
    "critic_error": "critic/calibration_error",
    "decode_tokens": "compute/decode_tokens",
    "full_rollout_tokens": "compute/full_rollout_tokens",
    "tokens_saved": "compute/tokens_saved",
    "decode_flops": "compute/decode_flops",
    "cum_decode_flops": "compute/cum_decode_flops",
    "cum_critic_flops": "compute/cum_critic_flops",
    "cum_train_flops": "compute/cum_train_flops",
}


def tokens_saved(m: dict) -> float | None:
    """Share of decode tokens saved against full rollouts of the same problems (None before any rollout)."""
    full = m.get("full_rollout_tokens") or 0
    return 1.0 - m["decode_tokens"] / full if full > 0 else None


def _cell(value, fmt: str) -> str:
    width = len(fmt.format(0.0))
    return f"{'-':>{width}}" if value is None else fmt.format(value)


def format_row(m: dict) -> str:
    """One iteration's console line, under ``HEADER``."""
    val = "   -  " if m["val_score"] is None else f"{m['val_score']:.3f}"
    # failed judgements are masked, not scored; say so where the run is watched
    ungraded = (
        f"   ungraded: {m['ungraded_chunks']} chunks, {m['ungraded_val'] or 0} val"
        if m["ungraded_chunks"] or m["ungraded_val"]
        else ""
    )
    stats = " ".join(_cell(m.get(key), fmt) for key, _, fmt, _ in STATS)
    return (
        f"{m['iteration']:>5} {val:>6} {m['readiness_share']:>7.2f} {m['chunk_groups']:>6}/{m['full_groups']:<4}"
        f" {m['decode_tokens']:>9} {m['full_rollout_tokens']:>9.0f} {_cell(tokens_saved(m), '{:>6.1%}')}"
        f" {stats} {m['cum_decode_flops']:>13.3e}{ungraded}"
    )


def _md(value, fmt: str) -> str:
    return "" if value is None else fmt.format(value)


def metrics_markdown(rows: list[dict], seconds: dict[int, dict[str, float]] | None = None) -> str:
    """The per-iteration figures as a Markdown table, and the validation score's first and last value.

    ``seconds`` (iteration -> stage -> wall seconds) adds each iteration's time; it is kept out of
    the metrics artifact, which must be byte-identical on a rerun.
    """
    timed = bool(seconds)
    head = ["iteration", "validation score", "readiness share", "chunk/full groups", "decode tokens", "full-rollout tokens"]
    head += ["tokens saved", *(h for *_, h in STATS), "decode FLOPs (cum.)", "algorithm", "config"]
    head += ["seconds"] if timed else []
    align = ["---:"] * len(head)
    align[head.index("algorithm")] = align[head.index("config")] = ":---"
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for m in rows:
        cells = [
            str(m["iteration"]),
            _md(m["val_score"], "{:.3f}"),
            f"{m['readiness_share']:.2f}",
            f"{m['chunk_groups']}/{m['full_groups']}",
            str(m["decode_tokens"]),
            f"{m['full_rollout_tokens']:.0f}",
            _md(tokens_saved(m), "{:.1%}"),
            *(_md(m.get(key), "{:.4g}") for key, *_ in STATS),
            f"{m['cum_decode_flops']:.3e}",
            m.get("algorithm") or "",
            (m.get("config_hash") or "")[:12],
        ]
        if timed:
            it = (seconds or {}).get(m["iteration"])
            cells.append(f"{sum(it.values()):.1f}" if it else "")
        lines.append("| " + " | ".join(cells) + " |")
    totals = run_totals(rows)
    return "\n".join(lines + ([""] + totals if totals else []))


def run_totals(rows: list[dict], *, last: int = 5) -> list[str]:
    """The run in a few lines: the validation score, the decode tokens spent against what full
    rollouts of the same problems would have decoded, and (AC2) how often and how well the
    critic was trusted: the ready share over the iterations, and its out-of-sample AUC at the
    end and over the ``last`` iterations that have one."""
    lines = []
    scored = [m for m in rows if m["val_score"] is not None]
    if scored:
        best = max(scored, key=lambda m: m["val_score"])
        lines.append(
            f"validation score: {scored[0]['val_score']:.3f} at iteration {scored[0]['iteration']}"
            f" -> {scored[-1]['val_score']:.3f} at iteration {scored[-1]['iteration']}"
            f" (best {best['val_score']:.3f} at iteration {best['iteration']})"
        )
    trained = [m for m in rows if m["iteration"] > 0]
    # an iteration that decoded no full answer has no length to price its chunk-mode problems at
    known = [m for m in trained if m["full_rollout_tokens"] > 0]
    if known:
        spent = sum(m["decode_tokens"] for m in known)
        full = sum(m["full_rollout_tokens"] for m in known)
        span = f"iterations {trained[0]['iteration']}-{trained[-1]['iteration']}"
        if len(known) < len(trained):
            total = sum(m["decode_tokens"] for m in trained)
            unpriced = len(trained) - len(known)
            span = (
                f"{span} ({total:,} in all; left out: {unpriced} iteration{'s' * (unpriced != 1)} with no full answer"
                " to price chunk mode at)"
            )
        lines.append(
            f"decoded: {spent:,} tokens over {span}, against {full:,.0f} that full rollouts of the same problems"
            f" would have decoded: {1 - spent / full:.1%} saved"
        )
    if any(m.get("algorithm") == "ac2" for m in trained):
        share = sum(m["readiness_share"] for m in trained) / len(trained)
        line = f"critic: ready share {share:.2f} (mean over iterations)"
        aucs = [m for m in trained if m.get("critic_auc") is not None]
        if aucs:
            tail = aucs[-last:]
            line += (
                f", out-of-sample AUC {aucs[-1]['critic_auc']:.3f} at iteration {aucs[-1]['iteration']}"
                f" ({sum(m['critic_auc'] for m in tail) / len(tail):.3f} over the last {len(tail)} with one)"
            )
        lines.append(line)
    return lines


def samples_markdown(samples: list[dict], *, limit: int = 300) -> str:
    """An iteration's decoded samples (``schemas.SAMPLES``) as a Markdown table, texts cut at ``limit`` characters."""

    def text(s: str) -> str:
        s = s if len(s) <= limit else s[:limit] + "…"
        return s.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| problem | mode | prompt | answer | reward | target |", "|:---|:---|:---|:---|---:|---:|"]
    for s in samples:
        lines.append(
            f"| {s['problem_id']} | {s['mode']} | {text(s['prompt'])} | {text(s['answer'])} |"
            f" {_md(s['reward'], '{:.2f}')} | {_md(s['target'], '{:.2f}')} ({s['target_source']}) |"
        )
    return "\n".join(lines)


def _flops_unit(largest: float) -> tuple[float, str]:
    for scale, unit in ((1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP")):
        if largest >= scale:
            return scale, unit
    return 1.0, "FLOP"


def plot_learning_curves(runs: dict[str, list[dict]], out: Path) -> None:
    """Validation score of each run (label -> metrics rows) against iterations and against
    cumulative decode FLOPs, side by side, one line per run with a legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = {label: [r for r in rows if r["val_score"] is not None] for label, rows in runs.items()}
    scale, unit = _flops_unit(max((r["cum_decode_flops"] for rows in scored.values() for r in rows), default=0.0))
    fig, (by_iter, by_flops) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120, sharey=True)
    for label, rows in scored.items():
        by_iter.plot([r["iteration"] for r in rows], [r["val_score"] for r in rows], marker="o", ms=3, label=label)
        flops = [r["cum_decode_flops"] / scale for r in rows]
        by_flops.plot(flops, [r["val_score"] for r in rows], marker="o", ms=3, label=label)
    by_iter.set_xlabel("iteration")
    by_flops.set_xlabel(f"cumulative decode compute ({unit})")
    by_iter.set_ylabel("validation score (mean reward)")
    by_iter.set_ylim(-0.03, 1.03)  # rewards, so scores, are in [0, 1]
    for ax in (by_iter, by_flops):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("validation score: " + " vs ".join(runs), fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def run_label(run_dir: str, rows: list[dict]) -> str:
    """A run's name in a legend: its folder's name and algorithm (every toy run's run_id is the same)."""
    algorithm = rows[-1].get("algorithm") if rows else None
    name = str(run_dir).rstrip("/").rsplit("/", 1)[-1]
    return f"{name} ({algorithm})" if algorithm else name


def write_report(run_dirs: list[str], out_dir: str | None = None) -> tuple[str, str]:
    """``ac2 report``: ``learning_curve.png`` and ``report.md`` for one run folder (written into it)
    or several (into ``out_dir``), of either runner, local or on object storage."""
    import tempfile

    from ac2_core import storage
    from ac2_core.runner.layout import RunLayout
    from ac2_core.runner.timings import read_timings

    if out_dir is None:
        if len(run_dirs) > 1:
            raise ValueError("ac2 report with several runs needs --out DIR for the figure and the table")
        out_dir = run_dirs[0]
    runs, sections = {}, []
    for run_dir in run_dirs:
        layout = RunLayout(str(run_dir).rstrip("/"))
        done = layout.completed_iterations()
        if not done:
            raise ValueError(f"{run_dir}: no finished iteration (no iter-*/evaluate/metrics)")
        rows = storage.read_rows(layout.output(done, "metrics"), kind="metrics")
        label = run_label(run_dir, rows)
        runs[label] = rows
        part = [f"## {label}", "", f"`{run_dir}`", "", metrics_markdown(rows, read_timings(layout.root))]
        if storage.exists(layout.output(done, "samples")):
            samples = storage.read_rows(layout.output(done, "samples"), kind="samples")
            part += ["", f"Samples of iteration {done}:", "", samples_markdown(samples)]
        sections.append("\n".join(part))
    png, md = storage.join(out_dir, "learning_curve.png"), storage.join(out_dir, "report.md")
    with tempfile.TemporaryDirectory(prefix="ac2-report-") as tmp:
        plot_learning_curves(runs, Path(tmp, "learning_curve.png"))
        storage.put_file(Path(tmp, "learning_curve.png"), png)
    title = " vs ".join(runs)
    storage.write_text(md, f"# {title}\n\n![learning curve](learning_curve.png)\n\n" + "\n\n".join(sections) + "\n")
    return png, md
