"""What a run shows per iteration: the console row under its header, and the summary table.

Users weigh AC2's savings, so both put the decode tokens spent beside what full rollouts of
the same problems would have decoded, the ready share and the critic's AUC."""

from __future__ import annotations

from ac2_core.runner.report import HEADER, format_row, metrics_markdown

ROW = {
    "iteration": 3,
    "val_score": 0.31,
    "readiness_share": 0.45,
    "chunk_groups": 12,
    "full_groups": 20,
    "decode_tokens": 5125,
    "full_rollout_tokens": 8200.0,
    "cum_decode_flops": 1.2e12,
    "ungraded_chunks": 0,
    "ungraded_val": 0,
    "critic_auc": 0.712,
    "critic_error": 0.05,
    "actor_loss": 0.01,
    "clip_fraction": 0.02,
    "grad_norm": 1.3,
    "kl": 0.001,
    "entropy": 1.2,
    "critic_loss": 0.6,
    "algorithm": "ac2",
    "config_hash": "0123456789abcdef",
}


def _console_cells(header: str, row: str) -> dict[str, str]:
    """Each header word -> the text of the row that ends where it ends (the columns are right-aligned)."""
    cells, start = {}, 0
    for word in header.split():
        end = header.index(word, start) + len(word)
        cells[word] = row[start:end].strip()
        start = end
    return cells


def test_the_console_row_puts_tokens_spent_against_full_rollouts_ready_share_and_auc_under_their_headers():
    cells = _console_cells(HEADER, format_row(ROW))
    # 1 - 5125 / 8200 = 0.375
    assert (cells["dec_tok"], cells["full_tok"], cells["saved"]) == ("5125", "8200", "37.5%")
    assert (cells["ready"], cells["auc"], cells["chunk/full"]) == ("0.45", "0.712", "12/20")
    assert cells["cum_dec_FLOPs"] == "1.200e+12" and cells["entropy"] == "1.200"


def test_the_summary_table_has_the_same_figures_per_iteration():
    lines = metrics_markdown([ROW], {3: {"generate_chunks": 2.5, "update_actor": 1.0}}).splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = dict(zip(head, (c.strip() for c in lines[2].strip("|").split("|")), strict=True))
    assert (cells["decode tokens"], cells["full-rollout tokens"], cells["tokens saved"]) == ("5125", "8200", "37.5%")
    assert (cells["readiness share"], cells["critic AUC"], cells["seconds"]) == ("0.45", "0.712", "3.5")
    assert (cells["algorithm"], cells["config"]) == ("ac2", "0123456789ab")


def test_the_summary_ends_with_the_run_totals():
    rows = [
        {**ROW, "iteration": 0, "val_score": 0.25, "decode_tokens": 0, "full_rollout_tokens": 0.0, "critic_auc": None},
        {**ROW, "iteration": 1, "val_score": None, "readiness_share": 0.2, "critic_auc": 0.6},
        {**ROW, "iteration": 2, "val_score": 0.4, "readiness_share": 0.6, "decode_tokens": 3000, "critic_auc": None},
        {**ROW, "iteration": 3, "val_score": 0.35, "readiness_share": 0.4, "critic_auc": 0.8},
    ]
    totals = metrics_markdown(rows).split("\n\n")[-1].splitlines()
    assert totals[0] == "validation score: 0.250 at iteration 0 -> 0.350 at iteration 3 (best 0.400 at iteration 2)"
    # spent 5125 + 3000 + 5125 = 13250 of 3 x 8200 = 24600: 1 - 13250 / 24600 = 46.1% saved
    assert totals[1] == (
        "decoded: 13,250 tokens over iterations 1-3, against 24,600 that full rollouts of the same problems"
        " would have decoded: 46.1% saved"
    )
    # ready share (0.2 + 0.6 + 0.4) / 3 = 0.40; AUC at 3 is 0.8, the mean of 0.6 and 0.8 is 0.7
    assert totals[2] == (
        "critic: ready share 0.40 (mean over iterations), out-of-sample AUC 0.800 at iteration 3 (0.700 over the last 2 with one)"
    )
    # an iteration with no full answer has no price for its chunk-mode problems: left out, and said so
    unpriced = [*rows, {**ROW, "iteration": 4, "decode_tokens": 250, "full_rollout_tokens": 0.0}]
    assert metrics_markdown(unpriced).split("\n\n")[-1].splitlines()[1] == (
        "decoded: 13,250 tokens over iterations 1-4 (13,500 in all; left out: 1 iteration with no full answer to price"
        " chunk mode at), against 24,600 that full rollouts of the same problems would have decoded: 46.1% saved"
    )
    grpo = [{**r, "algorithm": "grpo"} for r in rows]
    assert not any(line.startswith("critic:") for line in metrics_markdown(grpo).splitlines())
