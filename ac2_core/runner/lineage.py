"""``ac2 lineage``: the chain of artifacts that made one, back to the bootstrap, read from manifests.

Every manifest names the inputs of the stage that wrote it (``storage.lineage``): by their
path relative to the run folder (the runners) or by URI (``ac2 stage``), each with its
content hash. This walks them breadth-first, newest first, and says for each input
whether the artifact there now is the one that was read (same content hash), another one,
or gone (a pruned checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass

from ac2_core import storage
from ac2_core.runner.layout import RunLayout


@dataclass(frozen=True)
class Node:
    uri: str
    shown: str  # the URI as printed: relative to the run folder where it is in one
    manifest: storage.Manifest


def resolve(named: str, root: str | None) -> str:
    """An input's URI: a path relative to the run folder joined to ``root``; anything else as named."""
    if "://" in named or named.startswith("/") or root is None:
        return named
    return storage.join(root, named)


def _node(uri: str) -> Node:
    split = RunLayout.split(uri)
    return Node(uri, split[1] if split else uri, storage.read_manifest(uri))


def chain(uri: str, *, depth: int | None = None) -> list[str]:
    """The lines ``ac2 lineage`` prints for the artifact at ``uri``: one block per artifact in the
    chain, at most ``depth`` iterations back from it (None: to the bootstrap)."""
    split = RunLayout.split(uri)
    root = split[0] if split else None
    first = _node(uri)
    top = (first.manifest.lineage or {}).get("iteration")
    lines: list[str] = []
    queue, seen = [first], {first.uri}
    while queue:
        node = queue.pop(0)
        m = node.manifest
        lineage = m.lineage
        where = "" if lineage is None else f", iteration {lineage.get('iteration')}"
        lines.append(f"{node.shown}  [{m.kind} by {m.stage}{where}, content {m.content_hash[:12]}, config {m.config_hash[:12]}]")
        if lineage is None:
            if m.stage != "bootstrap":
                lines.append("    (its manifest names no inputs: written before ac2 recorded lineage)")
            continue
        for keyword, entry in sorted(lineage["inputs"].items()):
            source = resolve(entry["uri"], root)
            status, found = _status(source, entry["content_hash"])
            lines.append(f"    <- {keyword}: {entry['uri']} ({entry['content_hash'][:12]}{status})")
            it = (found.manifest.lineage or {}).get("iteration") if found else None
            too_far = depth is not None and top is not None and it is not None and top - it > depth
            if found is not None and found.uri not in seen and not too_far:
                seen.add(found.uri)
                queue.append(found)
    return lines


def _status(uri: str, content_hash: str) -> tuple[str, Node | None]:
    """What is at ``uri`` now against the content hash that was read there."""
    if not storage.exists(uri):
        return ", gone: not at this URI any more", None
    node = _node(uri)
    if node.manifest.content_hash != content_hash:
        return f", changed: {node.manifest.content_hash[:12]} there now", None
    return "", node
