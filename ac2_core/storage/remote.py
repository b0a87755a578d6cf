"""Requests to a file system with bounded retries, and transfers in parallel.

Every remote request is retried on transient errors, bounded in tries and in time
(``storage.max_attempts``, ``storage.max_retry_seconds``); s3fs's and botocore's own
retries are turned off (``uris``) so that these are the only bounds, and each attempt has
a hard time limit on top of the socket timeouts, so a stalled endpoint is reported
instead of waited on. Local paths are called once: retrying a local disk only delays
its error.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import TypeVar

from fsspec.asyn import AsyncFileSystem

from ac2_core.storage.manifest import ArtifactError
from ac2_core.storage.uris import Target

log = logging.getLogger("ac2_core.storage")
T = TypeVar("T")

# Errors that another try would meet again: a missing object, refused credentials, a bad request.
_PERMANENT = (ArtifactError, FileNotFoundError, PermissionError, FileExistsError, IsADirectoryError, NotADirectoryError)
_PERMANENT_ERRNOS = (errno.EINVAL, errno.EPERM, errno.EACCES, errno.EMSGSIZE, errno.ENOTEMPTY)


def _transient(err: BaseException) -> bool:
    """True for errors that another try may not meet: timeouts, dropped connections, 5xx."""
    if isinstance(err, (*_PERMANENT, ValueError, TypeError, KeyError)):
        return False
    if isinstance(err, (TimeoutError, ConnectionError)):  # asyncio's and fsspec's timeouts included
        return True
    with contextlib.suppress(ImportError):
        import botocore.exceptions as bx

        if isinstance(err, (bx.NoCredentialsError, bx.PartialCredentialsError, bx.ParamValidationError)):
            return False
        if isinstance(err, (bx.ConnectionError, bx.HTTPClientError, bx.IncompleteReadError, bx.ResponseStreamingError)):
            return True
        if isinstance(err, bx.ClientError):
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            return status >= 500 or err.response.get("Error", {}).get("Code") in ("SlowDown", "Throttling", "RequestTimeout")
    with contextlib.suppress(ImportError):
        import aiohttp

        if isinstance(err, aiohttp.ClientError):
            return True
    if isinstance(err, OSError):  # s3fs's translation of S3 error codes
        return err.errno not in _PERMANENT_ERRNOS
    return False


def _why(err: BaseException) -> str:
    text = str(err).strip() or repr(err)
    return f"{type(err).__name__}: {text}"


# An attempt that moves less than this counts as stalled: aiohttp has no write timeout,
# so a peer that stops reading would otherwise hold a PUT forever.
_STALL_BYTES_PER_SECOND = 1 << 20


def call(t: Target, what: str, method: str | Callable, *args, nbytes: int = 0, missing_ok: bool = False, **kwargs):
    """``t.fs.<method>(*args)`` with bounded retries; any failure becomes an ArtifactError
    naming the URI, except FileNotFoundError where the caller handles it (``missing_ok``).
    ``method`` may be a function of its own (one attempt; it takes ``timeout`` on an async file system)."""
    fn = getattr(t.fs, method) if isinstance(method, str) else method
    if t.local:
        return fn(*args, **kwargs)
    s = t.section
    if isinstance(t.fs, AsyncFileSystem):  # a hard bound per attempt, on top of the socket timeouts
        kwargs["timeout"] = s.connect_timeout + 3 * s.read_timeout + nbytes / _STALL_BYTES_PER_SECOND
    start = time.monotonic()
    for attempt in range(1, s.max_attempts + 1):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001  (sorted below)
            if isinstance(err, FileNotFoundError) and missing_ok:
                raise
            if not _transient(err):
                verb = "was refused by" if isinstance(err, PermissionError) else "failed at"
                raise ArtifactError(f"{t.uri}: {what} {verb} {t.endpoint}: {_why(err)}") from err
            elapsed = time.monotonic() - start
            pause = s.backoff_seconds * 2 ** (attempt - 1)
            if attempt == s.max_attempts or elapsed + pause > s.max_retry_seconds:
                raise ArtifactError(
                    f"{t.uri}: {what} failed after {attempt} attempt(s) in {elapsed:.1f}s at {t.endpoint}"
                    f" (storage.max_attempts={s.max_attempts}, storage.max_retry_seconds={s.max_retry_seconds:g});"
                    f" last error: {_why(err)}"
                ) from err
            log.warning("%s: %s failed (%s); retry %d of %d in %.1fs", t.uri, what, _why(err), attempt, s.max_attempts - 1, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")


def in_parallel(jobs: list[Callable[[], T]], threads: int) -> list[T]:
    """Run ``jobs`` on a thread pool; the first error cancels what has not started and is raised."""
    if len(jobs) <= 1 or threads <= 1:
        return [job() for job in jobs]
    with ThreadPoolExecutor(max_workers=min(threads, len(jobs)), thread_name_prefix="ac2-storage") as pool:
        futures = [pool.submit(job) for job in jobs]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for f in pending:
            f.cancel()
        failed = [f for f in futures if f.done() and not f.cancelled() and f.exception() is not None]
        if failed:
            wait([f for f in pending if not f.cancelled()])  # let started transfers end before raising
            raise failed[0].exception()
        return [f.result() for f in futures]


def objects(t: Target) -> list[str]:
    """Names of the objects under a remote artifact, relative to it."""
    found = call(t, "listing", "find", t.path, detail=True)
    prefix = t.path.rstrip("/") + "/"
    return sorted(p[len(prefix) :] for p, info in found.items() if info.get("type") == "file" and p.startswith(prefix))
