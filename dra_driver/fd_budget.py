"""File descriptors kept for the work that matters: raise the soft limit at start, and let servers that
only answer scrapes and probes refuse new connections before the process runs short.

A daemon's real job (the plugin's prepare: checkpoint, CDI spec, gRPC; the controller's API calls)
opens files and sockets. Without a reserve, a neighbour holding idle connections to /metrics can take
every descriptor, and prepare then fails with ``[Errno 24] Too many open files``. Two pieces:

* :func:`raise_nofile_limit` at start-up lifts the soft ``RLIMIT_NOFILE`` toward the hard limit (a
  container often starts with a soft 1,024 under a much higher hard limit).
* :class:`FdBudget` says whether a server may take one more connection: no while fewer than
  ``reserve`` descriptors are left below the soft limit. :func:`fd_shortage` is the pure verdict.
"""

from __future__ import annotations

import errno
import os
import resource
from dataclasses import dataclass

from dra_driver.logs import get_logger

log = get_logger(__name__)

# Beyond this a soft limit buys nothing for a daemon with a few hundred files open, and a few
# libraries size tables by it.
SOFT_LIMIT_CEILING = 1 << 20
# At least this many descriptors stay free for the daemon's own work, or a quarter of the limit.
MIN_RESERVE = 128


@dataclass(frozen=True)
class FdUsage:
    """Descriptors open now against the soft limit, and how many stay reserved."""

    open: int
    limit: int
    reserve: int

    @property
    def left(self) -> int:
        """Descriptors that can still be opened before the soft limit."""
        return self.limit - self.open


def default_reserve(soft_limit: int) -> int:
    """Descriptors kept back from scrape connections for a soft limit: a quarter, at least 128."""
    return max(MIN_RESERVE, soft_limit // 4)


def fd_shortage(usage: FdUsage) -> str | None:
    """Why no descriptor may go to a scrape or probe connection now (None: it may)."""
    if usage.left > usage.reserve:
        return None
    return (f"{usage.open} of {usage.limit} file descriptors open, {usage.left} left, at or below the "
            f"{usage.reserve} kept for prepare: raise the container's nofile limit or find who holds connections")


def count_open_fds(limit: int) -> int:
    """How many descriptors this process has open (``/proc/self/fd``; 0 where there is no /proc).
    When not even the listing can get a descriptor, every one of ``limit`` is in use."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor
    except OSError as exc:
        return limit if exc.errno in (errno.EMFILE, errno.ENFILE) else 0


def raise_nofile_limit(ceiling: int = SOFT_LIMIT_CEILING) -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (at most ``ceiling``); return (soft, hard).

    Never lowers it. A refusal (a sandbox that forbids it) is logged and the old limit kept: the
    daemon still runs, with the reserve :class:`FdBudget` keeps taken from the smaller limit.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("nofile_limit_raised", soft_was=soft, soft=target, hard=hard)
            soft = target
        except (OSError, ValueError) as exc:
            log.warning("nofile_limit_not_raised", soft=soft, hard=hard, error=str(exc))
    return soft, hard


class FdBudget:
    """Whether this process may spend one more descriptor on a connection that is not its real job."""

    def __init__(self, reserve: int | None = None) -> None:
        self._reserve = reserve

    def usage(self) -> FdUsage:
        """Descriptors open now, the soft limit now (it may have been raised since) and the reserve."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        limit = SOFT_LIMIT_CEILING if soft == resource.RLIM_INFINITY else int(soft)
        reserve = self._reserve if self._reserve is not None else default_reserve(limit)
        return FdUsage(open=count_open_fds(limit), limit=limit, reserve=reserve)

    def shortage(self) -> str | None:
        """:func:`fd_shortage` of :meth:`usage`."""
        return fd_shortage(self.usage())
