"""The driver client bounds what a driver answers (its image is the app author's): a real HTTP server on loopback
answering too much, too slowly, or refusing."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sluice.operator.driver_client import MAX_RESPONSE_BYTES, DriverClient, DriverRefused, DriverUnavailable

CHUNK = b"x" * 65536


class Driver(BaseHTTPRequestHandler):
    """/v1/status: 100 MB; /v1/executors: a byte every 0.2 s for a minute; /v1/state: a refusal."""

    sent: dict[str, int] = {}

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(100 * 1024 * 1024))
        self.end_headers()
        sent = 0
        try:
            while sent < 100 * 1024 * 1024:
                self.wfile.write(CHUNK)
                sent += len(CHUNK)
        except OSError:  # the client hung up
            pass
        Driver.sent[self.path] = sent

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/state":
            body = json.dumps({"error": "queries out, seen are still running"}).encode()
            self.send_response(409)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Length", "300")
        self.end_headers()
        try:
            for _ in range(300):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def driver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Driver)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_answer_past_the_size_limit_is_refused_without_reading_it_all(driver: str) -> None:
    client = DriverClient(timeout=30)
    with pytest.raises(DriverUnavailable, match=f"answered more than {MAX_RESPONSE_BYTES} bytes"):
        client.status(driver)
    client.close()
    time.sleep(0.5)  # the server notices the hang-up
    assert Driver.sent.get("/v1/status", 0) < 100 * 1024 * 1024, "the client read the whole 100 MB"


def test_an_answer_trickled_past_the_timeout_is_given_up(driver: str) -> None:
    client = DriverClient(timeout=1)
    with pytest.raises(DriverUnavailable, match="no complete answer within 1 s"):
        client.set_executors(driver, "token", 2)
    client.close()


def test_a_refusal_still_carries_the_drivers_own_error(driver: str) -> None:
    client = DriverClient(timeout=5)
    with pytest.raises(DriverRefused, match="queries out, seen are still running"):
        client.set_state(driver, "token", "drained")
    client.close()


def test_a_newer_drivers_answer_with_fields_this_release_does_not_know_is_read() -> None:
    """A driver of a newer release answers this operator (an app's own image, or the operator rolled back): its
    unknown fields are ignored; what the operator asks a driver stays strict."""
    from pydantic import ValidationError

    from sluice.api.contract import DriverStatus, ExecutorsRequest

    answer = {
        "app": "wc",
        "revision": "r1",
        "observedAt": "2026-11-29T00:00:00Z",
        "queries": [{"name": "out", "active": True, "lagMillis": 5}],
        "futureField": {"x": 1},
    }
    status = DriverStatus.model_validate_json(json.dumps(answer))
    assert status.queries[0].name == "out" and not hasattr(status, "futureField")
    with pytest.raises(ValidationError, match="extra"):
        ExecutorsRequest.model_validate({"target": 2, "futureField": 1})
