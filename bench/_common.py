"""What the benchmarks share: the bootstrap they start from, and how a Markdown report is published."""

from __future__ import annotations

from pathlib import Path


def publish(text: str, path: Path) -> None:
    """Print ``text``, write it to ``path`` atomically, and print the command in its ``Reproduce:`` line."""
    print("\n" + text)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    print(f"wrote {path}")
    print(f"reproduce: {text.split('Reproduce: `')[1].split('`')[0]}")


def add_run_arguments(parser, *, bootstrap_help: str) -> None:
    """The options every benchmark on the toy config takes: where its bootstrap and work go, and threads."""
    parser.add_argument("--bootstrap-from", help=bootstrap_help)
    parser.add_argument("--out", help="work folder (default: a temporary one)")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch threads (default: ac2's choice, the CPUs this process may use; ac2_core.threads)",
    )


def set_threads(threads: int | None) -> None:
    """``--threads``: torch's thread count here, and through ``OMP_NUM_THREADS`` in every ModelStore
    (``ac2_core.threads``), which would otherwise choose the CPUs this process may use."""
    if threads:
        import os

        import torch

        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def prepare_bootstrap(cfg, layout, source: str | None) -> None:
    """Adopt ``source``'s bootstrap when given, else make one; either way not measured."""
    import time

    from ac2_core.runner import inprocess, loop

    t0 = time.perf_counter()
    if source:
        loop.adopt_bootstrap(cfg, layout, source)  # a run folder of either runner
    else:
        inprocess.run_bootstrap(cfg, layout)
    print(f"bootstrap (not measured): {time.perf_counter() - t0:.1f}s", flush=True)
