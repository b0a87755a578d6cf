"""``ac2 report RUN_DIR``: the learning curve (validation score against cumulative decode
FLOPs) as a PNG, and the per-iteration figures as a Markdown table."""

from __future__ import annotations

from pathlib import Path

from ac2_core import storage
from ac2_core.runner.inprocess import completed_iterations
from ac2_core.runner.layout import RunLayout
from ac2_core.runner.report import metrics_markdown
from pipelines import driver

RUNS_FILE = Path("kfp", "runs.json")


def metrics_uri(run_dir: str | Path) -> str:
    """The newest metrics table of a run folder written by either runner."""
    runs = Path(run_dir, RUNS_FILE)
    if runs.exists():  # the kfp runner: URIs are wherever KFP put them
        return driver.RunState.load(runs).metrics_uri()
    layout = RunLayout(str(run_dir))
    done = completed_iterations(layout)
    if not done:
        raise ValueError(f"{run_dir}: no finished iteration (neither {RUNS_FILE} nor iter-*/evaluate/metrics)")
    return layout.output(done, "metrics")


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
    """Write ``learning_curve.png`` and ``report.md`` into ``run_dir``; returns both paths."""
    rows = storage.read_rows(metrics_uri(run_dir), kind="metrics")
    if not rows:
        raise ValueError(f"{run_dir}: the metrics table is empty")
    png, md = Path(run_dir, "learning_curve.png"), Path(run_dir, "report.md")
    title = f"{rows[-1]['run_id']}: validation score vs decode compute"
    plot_learning_curve(rows, png, title)
    md.write_text(f"# {rows[-1]['run_id']}\n\n![learning curve]({png.name})\n\n{metrics_markdown(rows)}\n")
    return png, md
