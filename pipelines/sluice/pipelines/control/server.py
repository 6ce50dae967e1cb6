"""The control port: its routes as a WSGI app, served by cheroot's thread pool (ControlServer).

Open: GET /metrics (prometheus-client's WSGI app), GET /healthz. Token-guarded writes: PUT /v1/executors,
PUT /v1/pipeline (a hot swap), PUT /v1/state (a standby driver's activation, a drain, a resume), DELETE
/v1/checkpoints (what a finished checkpoint migration left behind).
GET /v1/status is open like /metrics (it tells no more than the metrics do).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, TypeVar

from cheroot import wsgi
from prometheus_client import make_wsgi_app
from pydantic import BaseModel, ValidationError

from sluice.api.contract import ApiError, DeleteCheckpointsRequest, ExecutorsRequest, StateRequest, SwapRequest
from sluice.api.validation import PipelineInvalid, join_path

from .auth import ControlToken
from .errors import ApiFailure
from .executors import Executors
from .latest import LatestOffsets
from .status import driver_status, observe_triggers, topics_now

if TYPE_CHECKING:
    from ..pipeline_run import PipelineRun

log = logging.getLogger("sluice.control")
MAX_BODY_BYTES = 64 * 1024
TRIGGER_POLL_SECONDS = 0.25  # how late a batch's start may be noticed: busy time it may miss
Environ = dict[str, Any]
StartResponse = Callable[..., Any]
Handler = Callable[[Environ, StartResponse], Iterable[bytes]]


RequestModel = TypeVar("RequestModel", bound=BaseModel)


def parse_request(model: type[RequestModel], body: bytes, example: str) -> RequestModel:
    """The request, or ApiFailure 400 naming the first bad field (strict: "2" and 2.0 are not 2)."""
    try:
        return model.model_validate_json(body, strict=True)
    except ValidationError as exc:
        error = exc.errors()[0]
        if error["type"] == "json_invalid":
            raise ApiFailure(400, f"the body is not JSON ({error['msg']}); send {example}") from None
        field = join_path("", *error["loc"]) or None
        message = {"extra_forbidden": "unknown field", "missing": "required"}.get(error["type"], error["msg"])
        raise ApiFailure(400, f"{field}: {message}" if field else message, field=field) from None


def read_body(environ: Environ) -> bytes:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiFailure(400, "Content-Length is not a number") from None
    if length > MAX_BODY_BYTES:
        raise ApiFailure(413, f"the body is over {MAX_BODY_BYTES} bytes")
    return environ["wsgi.input"].read(length) if length > 0 else b""


def respond(
    start_response: StartResponse,
    status: int,
    body: bytes,
    content_type: str = "application/json",
    headers: Iterable[tuple[str, str]] = (),
) -> list[bytes]:
    start_response(
        f"{status} {HTTPStatus(status).phrase}",
        [("Content-Type", content_type), ("Content-Length", str(len(body))), *headers],
    )
    return [body]


def respond_model(start_response: StartResponse, model: BaseModel, status: int = 200) -> list[bytes]:
    return respond(start_response, status, model.model_dump_json().encode())


class ControlApi:
    """The WSGI app of the control port."""

    def __init__(
        self, run: PipelineRun, executors: Executors, token: ControlToken, latest: LatestOffsets | None = None
    ) -> None:
        self.run = run
        self.executors = executors
        self.token = token
        self.latest = latest
        self.prometheus = make_wsgi_app(run.metrics.registry)
        self.routes: dict[str, dict[str, Handler]] = {
            "/metrics": {"GET": self.metrics},
            "/healthz": {"GET": self.health},
            "/v1/status": {"GET": self.status},
            "/v1/executors": {"PUT": self.put_executors},
            "/v1/pipeline": {"PUT": self.put_pipeline},
            "/v1/state": {"PUT": self.put_state},
            "/v1/checkpoints": {"DELETE": self.delete_checkpoints},
        }

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO") or "/", environ.get("REQUEST_METHOD", "GET")
        try:
            methods = self.routes.get(path)
            if methods is None:
                raise ApiFailure(404, f"no such path: {path} (try {', '.join(self.routes)})")
            handler = methods.get(method)
            if handler is None:
                raise ApiFailure(
                    405, f"{path} takes {', '.join(methods)}, not {method}", headers=(("Allow", ", ".join(methods)),)
                )
            return handler(environ, start_response)
        except ApiFailure as failure:
            return respond(
                start_response, failure.status, failure.error.model_dump_json().encode(), headers=failure.headers
            )
        except Exception as exc:  # a broken request must not take the driver down
            log.exception("control API: %s %s failed", method, path)
            return respond_model(start_response, ApiError(error=f"internal error: {exc}"), 500)

    def _authorized(self, model: type[RequestModel], environ: Environ, example: str) -> RequestModel:
        """A write's request body, once its bearer token is the control token (401 otherwise, 400 for a bad body)."""
        self.token.check(environ.get("HTTP_AUTHORIZATION"))
        return parse_request(model, read_body(environ), example)

    def metrics(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        """The series, with the live executors and each topic's backlog against Kafka's end offsets now."""
        self.run.metrics.executors.labels(app=self.run.metrics.app).set(len(self.executors.live()))
        self.run.metrics.record_backlogs(topics_now(self.run, self.latest)[0])
        return self.prometheus(environ, start_response)

    def health(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        healthy = self.run.healthy()
        states = [state.__dict__ | {"progress": None} for state in self.run.states()]
        return respond(
            start_response, 200 if healthy else 503, json.dumps({"healthy": healthy, "queries": states}).encode()
        )

    def status(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        return respond_model(start_response, driver_status(self.run, self.executors, self.latest))

    def put_executors(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        request = self._authorized(ExecutorsRequest, environ, '{"target": N}')
        response = self.executors.scale(request.target)
        log.info(
            "executors: target %d (%d live before), killed %s",
            response.target,
            response.previous,
            response.killed or "none",
        )
        return respond_model(start_response, response)

    def put_pipeline(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        """A hot swap: 409 when it does not fit this run (nothing changed), 422 when the new pipeline does not
        compile or a query fails to start on it (the old plan runs on), naming the node."""
        from ..plancheck import failure_message
        from ..swap_steps import SwapRefused

        request = self._authorized(SwapRequest, environ, '{"config": RunnerConfig, "steps": [...]}')
        try:
            response = self.run.swap(request.config, request.steps)
        except SwapRefused as exc:
            raise ApiFailure(409, str(exc), field=exc.field) from None
        except PipelineInvalid as exc:
            first = exc.problems[0]
            raise ApiFailure(422, str(exc), field=join_path("config", first.path)) from None
        except Exception as exc:  # Spark refused to start a query: its first line names the problem
            raise ApiFailure(
                422, f"a query failed to start on revision {request.config.revision}: {failure_message(exc)}"
            ) from None
        log.info(
            "revision %s: restarted %s, started %s, stopped %s",
            response.revision,
            response.restarted,
            response.started,
            response.stopped,
        )
        return respond_model(start_response, response)

    def put_state(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        """Answers once the queries started (running) or stopped at a batch boundary (drained); 409 while the
        driver stops (a drain is answered once it stopped its queries), 422 when a query fails to start (the run
        stays as it was), naming it."""
        from ..swap_steps import SwapRefused

        request = self._authorized(StateRequest, environ, '{"state": "running" | "drained"}')
        try:
            return respond_model(start_response, self.run.set_state(request.state, request.config))
        except SwapRefused as exc:
            raise ApiFailure(409, str(exc), field=exc.field) from None
        except PipelineInvalid as exc:
            first = exc.problems[0]
            raise ApiFailure(422, str(exc), field=join_path("config", first.path)) from None

    def delete_checkpoints(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        """409, nothing deleted, when the running revision still needs one of the folders."""
        from ..swap_steps import SwapRefused

        request = self._authorized(DeleteCheckpointsRequest, environ, '{"checkpoints": ["<folder>"]}')
        try:
            return respond_model(start_response, self.run.delete_checkpoints(request.checkpoints))
        except SwapRefused as exc:
            raise ApiFailure(409, str(exc), field=exc.field) from None


class WsgiServer:
    """A WSGI app on a port, served by cheroot (CherryPy's HTTP server) from a pool of threads: a request that
    takes long (a hot swap) does not hold up the others, a client that sends nothing is dropped after
    `timeout` seconds, and idle keep-alive connections hold no thread."""

    def __init__(self, app: Handler, host: str, port: int, threads: int = 8, timeout: float = 30) -> None:
        self.server = wsgi.Server((host, port), app, numthreads=threads, timeout=int(timeout), server_name="sluice")
        self.server.prepare()  # bound and listening: the port is known, also when 0 asked the system for one
        self.port: int = self.server.bind_addr[1]
        self.thread = threading.Thread(target=self.server.serve, name="sluice-control", daemon=True)

    def start(self) -> WsgiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(timeout=10)


class ControlServer:
    """The control API of a run, on its config's control port."""

    def __init__(self, run: PipelineRun, host: str = "0.0.0.0") -> None:
        self.api = ControlApi(
            run, Executors(run.spark), ControlToken(run.config.controlTokenFile), LatestOffsets(run.kafka)
        )
        self.server = WsgiServer(self.api, host, run.config.controlPort)
        self.port = self.server.port
        self._stopped = threading.Event()
        self.watch = threading.Thread(target=self._watch_triggers, name="sluice-triggers", daemon=True)

    def start(self) -> ControlServer:
        self.server.start()
        self.watch.start()
        return self

    def _watch_triggers(self) -> None:
        while not self._stopped.wait(TRIGGER_POLL_SECONDS):
            try:
                observe_triggers(self.api.run)
            except Exception:  # the watch must outlive a hiccup of the JVM gateway
                log.debug("trigger watch failed", exc_info=True)

    def stop(self) -> None:
        self._stopped.set()
        self.server.stop()
        if self.api.latest is not None:
            self.api.latest.close()
