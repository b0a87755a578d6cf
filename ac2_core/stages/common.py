"""What every stage shares: its stats type, seeds, problem lookup, and table I/O with the stage's name."""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass

import numpy as np

from ac2_core import storage
from ac2_core.config import AC2Config


@dataclass(frozen=True)
class StageStats:
    """What a stage returns: its headline figures, named and typed by each stage's subclass.

    ``as_dict`` gives them as plain values: the KFP components copy them into their output
    artifacts' metadata, and ``ac2 stage`` prints them.
    """

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def seed_for(cfg: AC2Config, iteration: int, stage: str) -> int:
    """A seed per (run seed, iteration, stage): stages draw independent, reproducible streams."""
    return int(np.random.SeedSequence([cfg.seed, iteration, zlib.crc32(stage.encode())]).generate_state(1)[0])


def rng_for(cfg: AC2Config, iteration: int, stage: str) -> np.random.Generator:
    return np.random.default_rng(seed_for(cfg, iteration, stage))


def write(cfg: AC2Config, stage: str, uri: str, rows: list[dict], kind: str) -> str:
    """Publish ``rows`` as a ``kind`` table; returns its content hash."""
    table = storage.table_from_rows(rows, kind)
    return storage.write_table(uri, table, kind=kind, stage=stage, config_hash=cfg.config_hash()).content_hash


def read(uri: str, kind: str) -> list[dict]:
    """Rows of a published table, verified against its manifest and schema."""
    return storage.read_rows(uri, kind=kind)


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The prompt as token ids; every stage encodes prompts this one way."""
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


@dataclass(frozen=True)
class Problems:
    by_id: dict[str, dict]

    @classmethod
    def load(cls, uri: str) -> Problems:
        rows = storage.read_rows(uri, kind="problems")
        if not rows:
            raise ValueError(f"{uri}: the problem set is empty")
        by_id = {r["problem_id"]: r for r in rows}
        if len(by_id) != len(rows):
            raise ValueError(f"{uri}: problem_id values are not unique")
        return cls(by_id)

    def ids(self, split: str) -> list[str]:
        return sorted(pid for pid, r in self.by_id.items() if r["split"] == split)

    def __getitem__(self, problem_id: str) -> dict:
        try:
            return self.by_id[problem_id]
        except KeyError:
            raise KeyError(f"problem {problem_id!r} is not in the problem set") from None
