"""How an ``ac2`` command ends: one line on stderr and a documented exit code.

    0    done
    1    failed: a run, stage, pipeline, launched process or artifact (the line names the
         artifact, file or task); also an unexpected error (a bug), whose one line says
         that ``ac2 --debug ...`` prints its traceback
    2    a bad config or command line (the line names the field or the flag)
    3    the run folder refuses this run: another run is writing to it (locked; the line
         names that run), or it holds another run (a config that differs from the recorded
         one, or ``--resume never`` on a folder that holds a run)
    130  interrupted (Ctrl-C); ``ac2 run`` says how to resume

``exit_code`` and ``one_line`` are the one mapping from an exception to both, for every
command (``pipelines.cli.main``); ``MEANING`` is the table above, which the README repeats.
"""

from __future__ import annotations

from ac2_core.config import ConfigError
from ac2_core.runner.lock import RunFolderLocked
from ac2_core.runner.record import RunFolderError
from ac2_core.storage import ArtifactError
from pipelines.driver import PipelineFailed

OK, FAILED, USAGE, RUN_FOLDER, INTERRUPTED = 0, 1, 2, 3, 130
MEANING = {
    OK: "done",
    FAILED: "failed: an artifact, a data file, a stage, a pipeline or a launched process (the message names it)",
    USAGE: "a bad command line or config",
    RUN_FOLDER: "the run folder refuses this run: locked by another run, or it holds another run",
    INTERRUPTED: "interrupted",
}

# the first match wins: ConfigError is a ValueError, RunFolderLocked and LaunchError are RuntimeErrors
CODES: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], int], ...] = (
    (ConfigError, USAGE),
    ((RunFolderError, RunFolderLocked), RUN_FOLDER),
    ((ArtifactError, PipelineFailed, ValueError, OSError, RuntimeError), FAILED),
)


def exit_code(err: BaseException) -> int | None:
    """The exit code of an error a user can act on; None for anything else (a bug)."""
    for kinds, code in CODES:
        if isinstance(err, kinds):
            return code
    return None


def one_line(err: BaseException) -> str:
    """The error's message on one line (a config error lists its fields, separated by ``;``)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    head, rest = lines[0], lines[1:]
    return head + (" " + "; ".join(rest) if rest else "")
