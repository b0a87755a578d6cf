"""An artifact's manifest: what it is, who wrote it, the hash of every file in it, and
(optionally) what it was made from."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

MANIFEST = "manifest.json"


class ArtifactError(RuntimeError):
    """An artifact that cannot be read or written; the message names the URI."""


@dataclass(frozen=True)
class Manifest:
    kind: str
    stage: str
    config_hash: str
    schema_version: int
    rows: int | None
    files: dict[str, dict]  # name -> {"sha256": ..., "bytes": ...}
    # optional: {"iteration": k, "inputs": {keyword: {"uri": ..., "content_hash": ...}}} (``storage.lineage``);
    # a separate field, absent from manifests written without it, so the manifest stays readable either way
    lineage: dict | None = None

    @property
    def content_hash(self) -> str:
        """One hash for the whole artifact: over its files' names and hashes."""
        h = hashlib.sha256()
        for name in sorted(self.files):
            h.update(f"{name}\0{self.files[name]['sha256']}\n".encode())
        return h.hexdigest()

    def to_json(self) -> str:
        body = {
            "format": "ac2-artifact",
            "kind": self.kind,
            "stage": self.stage,
            "config_hash": self.config_hash,
            "schema_version": self.schema_version,
            "rows": self.rows,
            "files": {k: self.files[k] for k in sorted(self.files)},
            "content_hash": self.content_hash,
        }
        if self.lineage is not None:
            body["lineage"] = self.lineage
        return json.dumps(body, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, uri: str) -> Manifest:
        try:
            body = json.loads(text)
            if body.get("format") != "ac2-artifact":
                raise ValueError("format is not ac2-artifact")
            return cls(
                kind=body["kind"],
                stage=body["stage"],
                config_hash=body["config_hash"],
                schema_version=int(body["schema_version"]),
                rows=body["rows"],
                files=dict(body["files"]),
                lineage=_lineage(body.get("lineage")),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ArtifactError(f"{uri}: {MANIFEST} is malformed ({e})") from None


def _lineage(value) -> dict | None:
    """The optional ``lineage`` field, checked for shape (a ValueError says what is wrong)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("inputs"), dict):
        raise ValueError("lineage is not {iteration, inputs}")
    for keyword, entry in value["inputs"].items():
        if not isinstance(entry, dict) or not {"uri", "content_hash"} <= entry.keys():
            raise ValueError(f"lineage input {keyword!r} lacks uri or content_hash")
    return value
