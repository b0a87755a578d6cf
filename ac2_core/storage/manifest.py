"""An artifact's manifest: what it is, who wrote it, the hash of every file in it, and
(optionally, ``lineage``) what it was made from.

A manifest is parsed against one declared schema (``ManifestSchema``) before anything in
it is used, so that a damaged or hostile ``manifest.json`` (a JSON list, a file entry that
is a string, a missing hash, a file name that leaves the artifact's folder) is refused
with an ``ArtifactError`` naming the URI and the field, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MANIFEST = "manifest.json"
FORMAT = "ac2-artifact"
_HEX64 = r"^[0-9a-f]{64}$"


class ArtifactError(RuntimeError):
    """An artifact that cannot be read or written; the message names the URI."""


class FileEntry(BaseModel):
    """One file of an artifact: its sha256 and size."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    sha256: Annotated[str, Field(pattern=_HEX64)]
    bytes: Annotated[int, Field(ge=0)]


class LineageInput(BaseModel):
    """One input of the stage that wrote an artifact: the URI it is named by and its content hash."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    uri: Annotated[str, Field(min_length=1)]
    content_hash: Annotated[str, Field(pattern=_HEX64)]


class Lineage(BaseModel):
    """What an artifact was made from (``storage.lineage``): the iteration and each input by keyword."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    iteration: Annotated[int, Field(ge=0)]
    inputs: dict[str, LineageInput]


class ManifestSchema(BaseModel):
    """``manifest.json`` as ``Manifest.to_json`` writes it; strict: no coercion, no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    format: Literal["ac2-artifact"]
    kind: Annotated[str, Field(min_length=1)]
    stage: Annotated[str, Field(min_length=1)]
    config_hash: str
    schema_version: Annotated[int, Field(ge=1)]
    rows: Annotated[int, Field(ge=0)] | None
    files: dict[str, FileEntry]
    content_hash: Annotated[str, Field(pattern=_HEX64)]
    lineage: Lineage | None = None  # absent from manifests written without it (a stage called outside a recording)

    @field_validator("files")
    @classmethod
    def _names_stay_inside(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        for name in files:
            parts = name.split("/")
            if name == MANIFEST or "\\" in name or "\0" in name or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"file name {name!r} is not a plain relative path inside the artifact")
        return files


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
            "format": FORMAT,
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
        """Parse ``text`` against ``ManifestSchema``; ArtifactError naming ``uri`` and the field on any flaw."""
        try:
            body = json.loads(text)
        except (ValueError, RecursionError) as e:  # RecursionError: nested deeper than the parser goes
            raise ArtifactError(f"{uri}: {MANIFEST} is malformed (not JSON: {e})") from None
        try:
            parsed = ManifestSchema.model_validate(body)
        except ValidationError as e:
            raise ArtifactError(f"{uri}: {MANIFEST} is malformed ({_first_problem(e)})") from None
        files = {name: {"sha256": f.sha256, "bytes": f.bytes} for name, f in parsed.files.items()}
        lineage = parsed.lineage.model_dump() if parsed.lineage is not None else None
        manifest = cls(parsed.kind, parsed.stage, parsed.config_hash, parsed.schema_version, parsed.rows, files, lineage)
        if manifest.content_hash != parsed.content_hash:
            raise ArtifactError(f"{uri}: {MANIFEST} is malformed (content_hash does not match the files it lists)")
        return manifest


def _first_problem(err: ValidationError) -> str:
    """The first schema violation as ``field: what was expected, found what``, and how many more."""
    problems = err.errors(include_url=False)
    first = problems[0]
    where = ".".join(str(part) for part in first["loc"]) or "the top level"
    found = type(first["input"]).__name__ if first["type"] != "missing" else "nothing"
    more = f"; {len(problems) - 1} more problem(s)" if len(problems) > 1 else ""
    return f"{where}: {first['msg']} (found {found}){more}"
