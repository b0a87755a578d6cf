"""The storage settings in effect: the config's ``storage`` section a runner makes active for a block."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from ac2_core.config import StorageConfig

_active: contextvars.ContextVar[StorageConfig | None] = contextvars.ContextVar("ac2_storage", default=None)


@contextlib.contextmanager
def using(section: StorageConfig) -> Iterator[StorageConfig]:
    """Make ``section`` (``cfg.storage``) the storage settings of this block.

    Runners wrap their work in it; a stage called on its own uses the defaults unless
    its caller does the same. The setting is scoped to the block (a context variable),
    so nothing leaks from one run into the next.
    """
    token = _active.set(section)
    try:
        yield section
    finally:
        _active.reset(token)


def settings() -> StorageConfig:
    """The storage settings in effect here: the innermost ``using`` block, or the defaults."""
    return _active.get() or StorageConfig()
