"""What every section of the config tree shares: the base class, the error, and the URL check."""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, model_serializer


class ConfigError(ValueError):
    """A config that cannot be used; the message names the field to change."""


class Section(BaseModel):
    """A config section: frozen, and unknown keys are errors.

    ``added_later`` names fields added after configs were in use: at their default they are
    left out of the dump, so such a config dumps, and hashes, as it did before the field
    existed, and its bootstraps and run folders stay adoptable and resumable."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    added_later: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _leave_out_later_defaults(self, handler):
        data = handler(self)
        for name in self.added_later:
            if getattr(self, name) == type(self).model_fields[name].default:
                data.pop(name, None)
        return data


_PLAIN_URL = re.compile(r"https?://[^/@\s]+(/\S*)?")


def plain_url(url: str, field: str) -> str:
    """``url`` if it is http(s)://host[:port][/path] without credentials; else a ValueError naming
    ``field`` (the message shows only what follows an ``@``, so a password in the URL is not echoed)."""
    if not _PLAIN_URL.fullmatch(url):
        raise ValueError(f"{field} must be http(s)://host[:port][/path] without credentials (found {url.split('@')[-1]!r})")
    return url
