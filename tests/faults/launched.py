"""A launched process for ``test_launched_processes``: it records its pid in the launch's folder and waits."""

from __future__ import annotations

import os
import sys
import time

from ac2_core import launch


def main(argv: list[str]) -> int:
    folder, _ = launch.read_spec(argv[0])
    rank = os.environ.get("RANK") or argv[1]  # torchrun's, or spawn's argument
    (folder / f".pid-{rank}").write_text(str(os.getpid()))
    (folder / f".pid-{rank}").rename(folder / f"pid-{rank}")
    time.sleep(600)
    return 0


if __name__ == "__main__":
    launch.exit_now(main(sys.argv[1:]))
