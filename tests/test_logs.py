"""Structured logs: one event per line, key=value (or JSON), caller's fields kept."""

from __future__ import annotations

import io
import json
import logging

import pytest

from dra_driver.logs import configure, get_logger


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    stream = io.StringIO()
    monkeypatch.delenv("GPUREADY_LOG_FORMAT", raising=False)
    configure("debug", stream)
    yield stream
    logging.getLogger().handlers.clear()


def test_one_line_per_event_with_context_fields(captured: io.StringIO) -> None:
    get_logger("t").info("claim_prepared", claim_uid="u-1", device="gpu-0", node="node a", skipped=None)
    (line,) = captured.getvalue().splitlines()
    assert " event=claim_prepared " in f" {line} "
    assert "claim_uid=u-1" in line and "device=gpu-0" in line and 'node="node a"' in line
    assert "skipped" not in line  # None fields are left out


def test_exception_keeps_callers_error_and_says_where(captured: io.StringIO) -> None:
    log = get_logger("t")
    try:
        {}["missing"]
    except KeyError:
        log.error("claim_prepare_error", exc_info=True, error="could not prepare", claim_uid="u-2")
    (line,) = captured.getvalue().splitlines()
    assert 'error="could not prepare"' in line
    assert "exception=\"KeyError: 'missing'\"" in line
    assert "where=test_logs.py:" in line


def test_json_format(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setenv("GPUREADY_LOG_FORMAT", "json")
    configure("info", stream)
    try:
        get_logger("t").warning("device_withdrawn", device="gpu-3", reason="XID 79")
        record = json.loads(stream.getvalue())
        assert record["event"] == "device_withdrawn" and record["level"] == "warning"
        assert record["device"] == "gpu-3"
    finally:
        logging.getLogger().handlers.clear()


def test_default_handler_follows_stderr_when_it_is_replaced(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # A background thread may log after the stderr the CLI started with was closed and replaced.
    old = io.StringIO()
    monkeypatch.setattr("sys.stderr", old)
    configure("info")
    try:
        old.close()
        new = io.StringIO()
        monkeypatch.setattr("sys.stderr", new)
        get_logger("t").info("plugin_registered", node="n1")
        assert "event=plugin_registered" in new.getvalue()
    finally:
        logging.getLogger().handlers.clear()
