"""What every section of the config tree shares: the base class, the error, and the URL check."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config that cannot be used; the message names the field to change."""


class Section(BaseModel):
    """A config section: frozen, and unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


_PLAIN_URL = re.compile(r"https?://[^/@\s]+(/\S*)?")


def plain_url(url: str, field: str) -> str:
    """``url`` if it is http(s)://host[:port][/path] without credentials; else a ValueError naming
    ``field`` (the message shows only what follows an ``@``, so a password in the URL is not echoed)."""
    if not _PLAIN_URL.fullmatch(url):
        raise ValueError(f"{field} must be http(s)://host[:port][/path] without credentials (found {url.split('@')[-1]!r})")
    return url
