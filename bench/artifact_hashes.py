"""The content hash of every artifact of a run folder, one line each, by its name in the run folder.

    .venv/bin/python bench/artifact_hashes.py RUN_DIR [RUN_DIR ...]

Two run folders made from the same config and seed list the same lines whichever runner
made them (pruned checkpoints are not listed); ``diff`` of two listings is the check that a change kept a run's bytes. A
kfp run folder written before the runners shared one layout (its ``kfp/runs.json`` maps
output names to kfp.local's own folders) is listed under the same names.

Not a test and not a benchmark: a tool for comparing runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ac2_core import storage  # noqa: E402

# the stage that writes each artifact in an iteration (the layout's folder names)
WRITER = {
    "replay": "sample_prefixes",
    "prefixes": "sample_prefixes",
    "chunks": "generate_chunks",
    "scored_chunks": "score_chunks",
    "critic_pairs": "score_chunks",
    "readiness": "check_readiness",
    "advantages": "check_readiness",
    "actor": "update_actor",
    "critic": "update_critic",
    "metrics": "evaluate",
}


def artifacts(run_dir: Path) -> dict[str, str]:
    """Name in the run folder -> URI, for every published artifact of the run."""
    runs = run_dir / "kfp" / "runs.json"
    body = json.loads(runs.read_text()) if runs.exists() else {}
    if isinstance(body.get("iterations"), dict):  # the older kfp layout: URIs under kfp.local's run folders
        found = {f"bootstrap/{name}": uri for name, uri in (body.get("bootstrap") or {}).items()}
        for it, outputs in body["iterations"].items():
            found.update({f"iter-{int(it):04d}/{WRITER[name]}/{name}": uri for name, uri in outputs.items()})
        return {name: uri for name, uri in found.items() if storage.exists(uri)}  # not the pruned checkpoints
    return {
        Path(uri).relative_to(run_dir).as_posix(): uri
        for uri in storage.find_artifacts(str(run_dir))
        if not Path(uri).relative_to(run_dir).as_posix().startswith("kfp/")
    }


def main(argv: list[str]) -> int:
    for run_dir in argv or ["."]:
        for name, uri in sorted(artifacts(Path(run_dir)).items()):
            print(f"{storage.content_hash(uri)}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
