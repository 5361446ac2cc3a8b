"""Read, modify, write an API object; on a conflict (HTTP 409) read it again and retry, a bounded number of times.

Every status write of both daemons is a PUT carrying the ``resourceVersion`` it read, so a concurrent
writer (the scheduler, the other daemon, another thread) makes it fail with 409 rather than overwrite
the other's change. The answer is always the same: read the object again, apply the change to the
newer copy, write again. :func:`update_with_retry` is that loop, once; the caller says how to read,
what to change and how to write, and learns which way it ended:

* :class:`Written` (the write's answer),
* :class:`Unchanged` (``modify`` found nothing to do on the copy read: the object as read),
* :class:`Gone` (the object no longer exists: ``read`` returned None, or the write answered 404),
* :class:`ConflictsExhausted` raised when every attempt met a conflict (the object keeps changing:
  the caller's own retry, e.g. the next pass or the kubelet's retry, picks it up later).

Any other error of the write is raised as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from dra_driver.kube_api import ApiError
from dra_driver.logs import get_logger

log = get_logger(__name__)

T = TypeVar("T")  # the object read and written (a claim as JSON)
R = TypeVar("R")  # what the write returns

CONFLICT = 409
NOT_FOUND = 404
ATTEMPTS = 3


class ConflictsExhausted(RuntimeError):
    """Every attempt met a conflict: the object changed between each read and its write."""


@dataclass(frozen=True)
class Written(Generic[R]):
    """The change was written; ``answer`` is what the write returned (the object as stored)."""

    answer: R


@dataclass(frozen=True)
class Unchanged(Generic[T]):
    """``modify`` found nothing to change on ``current``, the copy last read; nothing was written."""

    current: T


@dataclass(frozen=True)
class Gone:
    """The object no longer exists (or is no longer the one meant: ``read`` returned None)."""


def update_with_retry(what: str, read: Callable[[], T | None], modify: Callable[[T], T | None],
                      write: Callable[[T], R], *, attempts: int = ATTEMPTS,
                      current: T | None = None) -> Written[R] | Unchanged[T] | Gone:
    """Apply ``modify`` to the object and ``write`` it, reading it again after each conflict.

    ``read``: the object as stored now, or None when it is gone (deleted, or re-created under another
    UID). ``modify``: the object to write, from the copy read (it may change that copy in place), or
    None when there is nothing to change. ``write``: the write (a PUT guarded by the copy's
    ``resourceVersion``). ``current``: a copy already in hand (an informer's) tried first instead of a
    read. ``what`` names the object in the error raised when all ``attempts`` conflict.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    obj = current if current is not None else read()
    for attempt in range(1, attempts + 1):
        if obj is None:
            return Gone()
        body = modify(obj)
        if body is None:
            return Unchanged(obj)
        try:
            return Written(write(body))
        except ApiError as exc:
            if exc.status == NOT_FOUND:  # deleted between the read and the write
                return Gone()
            if exc.status != CONFLICT:
                raise
        log.debug("write_conflict", object=what, attempt=attempt, attempts=attempts)
        if attempt < attempts:
            obj = read()
    raise ConflictsExhausted(f"{what} kept changing ({attempts} conflicts)")
