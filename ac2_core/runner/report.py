"""What a run shows: a console row per iteration, the Markdown table, and the learning curve.

The console rows are printed by the iteration loop (both runners) and ``ac2 submit``; the
Markdown table is ``evaluate``'s KFP report, ``ac2 run``'s ``summary.md`` and part of
``ac2 report``, which adds the learning curve (validation score against cumulative
decode FLOPs). Rows are those of the metrics table (``schemas.METRICS``).
"""

from __future__ import annotations

from pathlib import Path

HEADER = f"{'iter':>5} {'val':>6} {'ready':>7} {'chunk/full':>11} {'dec_tok':>9} {'cum_dec_FLOPs':>12}"


def format_row(m: dict) -> str:
    """One iteration's console line, under ``HEADER``."""
    val = "   -  " if m["val_score"] is None else f"{m['val_score']:.3f}"
    # failed judgements are masked, not scored; say so where the run is watched
    ungraded = (
        f"   ungraded: {m['ungraded_chunks']} chunks, {m['ungraded_val'] or 0} val"
        if m["ungraded_chunks"] or m["ungraded_val"]
        else ""
    )
    return (
        f"{m['iteration']:>5} {val:>6} {m['readiness_share']:>7.2f} {m['chunk_groups']:>6}/{m['full_groups']:<4}"
        f" {m['decode_tokens']:>9} {m['cum_decode_flops']:>12.3e}{ungraded}"
    )


def metrics_markdown(rows: list[dict]) -> str:
    """The per-iteration figures as a Markdown table, and the validation score's first and last value."""
    lines = [
        "| iteration | validation score | readiness share | chunk/full groups | decode tokens | decode FLOPs (cum.) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for m in rows:
        val = "" if m["val_score"] is None else f"{m['val_score']:.3f}"
        lines.append(
            f"| {m['iteration']} | {val} | {m['readiness_share']:.2f} | {m['chunk_groups']}/{m['full_groups']} |"
            f" {m['decode_tokens']} | {m['cum_decode_flops']:.3e} |"
        )
    scored = [m for m in rows if m["val_score"] is not None]
    if scored:
        lines.append("")
        lines.append(
            f"validation score: {scored[0]['val_score']:.3f} at iteration {scored[0]['iteration']}"
            f" -> {scored[-1]['val_score']:.3f} at iteration {scored[-1]['iteration']}"
        )
    return "\n".join(lines)


def plot_learning_curve(rows: list[dict], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = [r for r in rows if r["val_score"] is not None]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.plot([r["cum_decode_flops"] for r in scored], [r["val_score"] for r in scored], marker="o")
    for r in scored:
        ax.annotate(
            str(r["iteration"]), (r["cum_decode_flops"], r["val_score"]), fontsize=7, xytext=(3, 3), textcoords="offset points"
        )
    ax.set_xlabel("cumulative decode FLOPs")
    ax.set_ylabel("validation score")
    ax.set_ylim(-0.03, 1.03)  # rewards, so scores, are in [0, 1]
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def write_report(run_dir: str | Path) -> tuple[Path, Path]:
    """``ac2 report``: write ``learning_curve.png`` and ``report.md`` into a run folder (either runner's)."""
    from ac2_core import storage
    from ac2_core.runner.layout import RunLayout

    layout = RunLayout(str(run_dir))
    done = layout.completed_iterations()
    if not done:
        raise ValueError(f"{run_dir}: no finished iteration (no iter-*/evaluate/metrics)")
    rows = storage.read_rows(layout.output(done, "metrics"), kind="metrics")
    png, md = Path(run_dir, "learning_curve.png"), Path(run_dir, "report.md")
    plot_learning_curve(rows, png, f"{rows[-1]['run_id']}: validation score vs decode compute")
    md.write_text(f"# {rows[-1]['run_id']}\n\n![learning curve]({png.name})\n\n{metrics_markdown(rows)}\n")
    return png, md
