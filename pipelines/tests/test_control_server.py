"""The control port's server (control/server.py's WsgiServer, on cheroot) with a plain WSGI app: no Spark."""

from __future__ import annotations

import socket
import threading
import urllib.request
from collections.abc import Iterable
from typing import Any

import pytest

from sluice.pipelines.control.server import WsgiServer


class App:
    """/slow waits until released; anything else answers at once with its path."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ["PATH_INFO"] == "/slow":
            self.release.wait(30)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [environ["PATH_INFO"].encode()]


def get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return response.read().decode()


@pytest.fixture
def served() -> Iterable[tuple[WsgiServer, App]]:
    app = App()
    server = WsgiServer(app, "127.0.0.1", 0, threads=2, timeout=1).start()
    try:
        yield server, app
    finally:
        app.release.set()
        server.stop()


def test_a_request_answers_while_a_slow_one_runs(served: tuple[WsgiServer, App]) -> None:
    server, app = served
    slow: list[str] = []
    waiting = threading.Thread(target=lambda: slow.append(get(server.port, "/slow")))
    waiting.start()
    assert get(server.port, "/v1/status") == "/v1/status"
    assert not slow, "the slow request is still running"
    app.release.set()
    waiting.join(10)
    assert slow == ["/slow"]


def test_clients_that_send_nothing_hold_no_thread(served: tuple[WsgiServer, App]) -> None:
    server, _ = served
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]  # twice the threads
    try:
        assert get(server.port, "/healthz") == "/healthz"
    finally:
        for connection in silent:
            connection.close()


def test_a_stopped_server_leaves_its_port() -> None:
    server = WsgiServer(App(), "127.0.0.1", 0).start()
    assert get(server.port, "/metrics") == "/metrics"
    server.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2)
