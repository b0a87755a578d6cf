"""A launched process for test_threads: reports the threads its ModelStore set (``python -m``)."""

from __future__ import annotations

import os
import sys

from ac2_core import launch
from ac2_core.config import config_from_json


def _report(spec: dict) -> dict:
    import torch

    from ac2_core.models.store import ModelStore

    store = ModelStore(config_from_json(spec["config"]))
    store.device  # noqa: B018 - resolving the device sets torch's threads
    return {"torch": torch.get_num_threads(), "why": store.threads.why, "env": os.environ.get("OMP_NUM_THREADS")}


def main(argv: list[str]) -> int:
    folder, spec = launch.read_spec(argv[0])
    rank = int(argv[1])
    return launch.run_child(folder, rank, lambda: launch.write_result(folder, rank, _report(spec)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
