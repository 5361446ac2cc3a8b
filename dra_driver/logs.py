"""Structured logging: one event per line, ``key=value`` pairs, a fixed set of leading keys.

Usage::

    log = get_logger(__name__)
    log.info("claim_prepared", claim_uid=uid, device="gpu-0", node=node)

Every line carries ``ts``, ``level``, ``logger`` and ``event``; the caller adds the claim UID,
device name and node where they apply. ``GPUREADY_LOG_FORMAT=json`` switches to JSON lines.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

_RESERVED = ("ts", "level", "logger", "event")


def _quote(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' ="\n\t'):
        return json.dumps(text)
    return text


class _KeyValueFormatter(logging.Formatter):
    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self._json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields.update(getattr(record, "kv", {}))
        if record.exc_info and record.exc_info[1] is not None:
            # Keep the caller's own ``error`` field; add the exception and where it was raised, so
            # an internal error keeps its file and line without a multi-line traceback.
            exc = record.exc_info[1]
            fields["exception"] = f"{type(exc).__name__}: {exc}"
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            if tb is not None:
                fields["where"] = f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        if self._json:
            return json.dumps(fields, default=str)
        return " ".join(f"{k}={_quote(v)}" for k, v in fields.items())


_PROCESS_FIELDS: dict[str, Any] = {}


def set_process_fields(**fields: Any) -> None:
    """Fields every event of this process carries unless the event sets them itself.

    For daemons that serve one node per process (the kubelet plugin sets ``node``), so events of code
    that does not know the node (NVML discovery, MIG instance changes) still say where they happened.
    Not for processes that run several nodes (the demo). ``None`` removes a field.
    """
    for key, value in fields.items():
        if value is None:
            _PROCESS_FIELDS.pop(key, None)
        else:
            _PROCESS_FIELDS[key] = value


class StructuredLogger:
    """A thin wrapper that turns keyword arguments into structured fields."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def _log(self, level: int, event: str, exc_info: bool, fields: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            kv = {k: v for k, v in {**_PROCESS_FIELDS, **fields}.items() if v is not None and k not in _RESERVED}
            self._logger.log(level, event, extra={"kv": kv}, exc_info=exc_info, stacklevel=3)

    def debug(self, event: str, **fields: Any) -> None:
        """Log a debug event."""
        self._log(logging.DEBUG, event, False, fields)

    def info(self, event: str, **fields: Any) -> None:
        """Log an info event."""
        self._log(logging.INFO, event, False, fields)

    def warning(self, event: str, **fields: Any) -> None:
        """Log a warning event."""
        self._log(logging.WARNING, event, False, fields)

    def error(self, event: str, exc_info: bool = False, **fields: Any) -> None:
        """Log an error event; ``exc_info=True`` adds the current exception's last line."""
        self._log(logging.ERROR, event, exc_info, fields)


def get_logger(name: str) -> StructuredLogger:
    """Return the structured logger for a module."""
    return StructuredLogger(logging.getLogger(name))


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of each event.

    A handler bound to the stderr of the moment breaks when that stream is replaced and closed
    (a test's captured stderr, a redirected CLI run) while background threads still log.
    """

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure(level: str = "info", stream: Any = None) -> None:
    """Configure root logging once per process (daemons and the CLI call this)."""
    handler: logging.Handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.setFormatter(_KeyValueFormatter(os.environ.get("GPUREADY_LOG_FORMAT", "") == "json"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # urllib3 logs every internal retry of a request as a multi-field warning (three per refused
    # connection); the code that made the request logs one structured line per failure, with its
    # backoff (dra_driver.kube_api.describe_error words it).
    logging.getLogger("urllib3").setLevel(logging.ERROR)


class LoggedErrorsMixin:
    """For ``socketserver`` servers: report a request handler's failure as one structured log line.

    The standard library prints a multi-line traceback to stderr for any exception in a handler,
    including a client hanging up mid-request, which breaks one-event-per-line logs. A client going
    away is normal (debug); anything else is an error with its type and message.
    """

    log_name = "http"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Log the exception being handled, on one line."""
        exc = sys.exc_info()[1]
        logger = get_logger("dra_driver.http")
        error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, (ConnectionError, TimeoutError)):
            logger.debug("http_client_went_away", server=self.log_name, client=str(client_address), error=error)
        else:
            logger.error("http_handler_failed", server=self.log_name, client=str(client_address), error=error)
