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


def test_a_failing_http_handler_is_one_log_line_not_a_traceback(captured: io.StringIO,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    import threading
    import urllib.request
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from dra_driver.logs import LoggedErrorsMixin

    class Boom(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            raise RuntimeError("handler bug")

    class Server(LoggedErrorsMixin, ThreadingHTTPServer):
        log_name = "test"

    server = Server(("127.0.0.1", 0), Boom)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/", timeout=5)
    finally:
        server.shutdown()
        server.server_close()
    lines = [line for line in captured.getvalue().splitlines() if "http_handler_failed" in line]
    assert len(lines) == 1 and "server=test" in lines[0] and "RuntimeError: handler bug" in lines[0], lines
    assert "Traceback" not in capfd.readouterr().err


def test_every_http_server_of_the_project_logs_its_errors_structured() -> None:
    from controller.daemon import _HealthServer
    from controller.webhooks.webhook_server import _TlsServer
    from dra_driver.logs import LoggedErrorsMixin
    from dra_driver.metrics_server import _MetricsServer
    from testbed.apiserver.server import _HttpServer

    for cls in (_HealthServer, _TlsServer, _HttpServer, _MetricsServer):
        assert issubclass(cls, LoggedErrorsMixin), cls


def test_process_fields_go_on_every_event_unless_the_event_sets_its_own(captured: io.StringIO) -> None:
    from dra_driver.logs import set_process_fields

    set_process_fields(node="gpu-node-7")
    try:
        get_logger("kubelet_plugin.nvml.mig_lifecycle").info("mig_device_created", device="gpu-0-mig-1g18gb-19-0")
        get_logger("x").info("other_node_event", node="elsewhere")
    finally:
        set_process_fields(node=None)
    get_logger("x").info("after_reset")
    lines = captured.getvalue().splitlines()
    assert "event=mig_device_created node=gpu-node-7 device=gpu-0-mig-1g18gb-19-0" in lines[0]
    assert "node=elsewhere" in lines[1] and "gpu-node-7" not in lines[1]
    assert "node=" not in lines[2]
