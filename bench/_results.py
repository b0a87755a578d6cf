"""What every benchmark does with its Markdown report: print it, write it whole, say how to reproduce it."""

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
