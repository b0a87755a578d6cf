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


def prepare_bootstrap(cfg, layout, source: str | None) -> None:
    """Adopt ``source``'s bootstrap when given, else make one; either way not measured."""
    import time

    from ac2_core.stages import inprocess

    t0 = time.perf_counter()
    if source:
        inprocess.adopt_bootstrap(cfg, layout, source)
    else:
        inprocess.run_bootstrap(cfg, layout)
    print(f"bootstrap (not measured): {time.perf_counter() - t0:.1f}s", flush=True)
