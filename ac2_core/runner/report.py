"""The per-iteration figures of a metrics table as Markdown (evaluate's report, ``ac2 run``'s summary)."""

from __future__ import annotations


def metrics_markdown(rows: list[dict]) -> str:
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
