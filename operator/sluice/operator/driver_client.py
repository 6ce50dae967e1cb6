"""Client of a driver's control API (served by sluice.pipelines.control; models in sluice.api.contract).

The operator talks to the driver pod directly (its IP, the control port): the API server's service proxy
drops the Authorization header, and the app's NetworkPolicy admits the control port from the operator's
pods only.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ValidationError

from sluice.api.contract import (
    ApiError,
    CheckpointsDeleted,
    DeleteCheckpointsRequest,
    DriverStatus,
    ExecutorsRequest,
    ExecutorsResponse,
    RunnerConfig,
    StateRequest,
    StateResponse,
    SwapRequest,
    SwapResponse,
)


class DriverUnavailable(Exception):
    """The driver did not answer, or answered with an error; the message says which."""


class DriverRefused(DriverUnavailable):
    """The driver refused a hot swap or a state change and runs on as before: the new pipeline does not compile
    or a query did not start on it (422), or the request does not fit its queries (409). The message is the
    driver's."""


# A status of thousands of queries fits; more is a driver gone wrong, and the driver's image is the app author's.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024


class DriverClient:
    """Every answer is bounded: at most MAX_RESPONSE_BYTES, and complete within the request's timeout (httpx's
    own timeouts bound each read, not a body trickled byte by byte)."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout
        self.http = httpx.Client(timeout=timeout)

    @staticmethod
    def address(pod_ip: str, port: int) -> str:
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        return f"http://{host}:{port}"

    def status(self, address: str) -> DriverStatus:
        text = self._call("GET", f"{address}/v1/status")
        try:
            return DriverStatus.model_validate_json(text)
        except ValidationError as exc:
            raise DriverUnavailable(f"{address}/v1/status does not match the contract: {exc.errors()[0]}") from exc

    def set_executors(self, address: str, token: str, target: int) -> ExecutorsResponse:
        body = ExecutorsRequest(target=target).model_dump_json()
        text = self._call(
            "PUT",
            f"{address}/v1/executors",
            content=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        return ExecutorsResponse.model_validate_json(text)

    def swap(self, address: str, token: str, request: SwapRequest) -> SwapResponse:
        # The driver stops the queries at a batch boundary and starts them on the new plan.
        return SwapResponse.model_validate_json(self._write(f"{address}/v1/pipeline", token, request, timeout=120.0))

    def set_state(
        self, address: str, token: str, state: Literal["running", "drained"], config: RunnerConfig | None = None
    ) -> StateResponse:
        """Activate a standby driver, drain one at a batch boundary, resume a drained one (on `config`, when
        given); DriverRefused when it is stopping (409) or a query did not start (422, the driver staying as it
        was)."""
        request = StateRequest(state=state, config=config)
        # config only when given: a driver of an earlier image knows no such field
        omit = {"config"} if config is None else None
        text = self._write(f"{address}/v1/state", token, request, timeout=120.0, exclude=omit)
        return StateResponse.model_validate_json(text)

    def delete_checkpoints(self, address: str, token: str, folders: list[str]) -> CheckpointsDeleted:
        """DriverRefused (nothing deleted) when the driver's revision still needs one of them."""
        request = DeleteCheckpointsRequest(checkpoints=folders)
        text = self._write(f"{address}/v1/checkpoints", token, request, timeout=60.0, method="DELETE")
        return CheckpointsDeleted.model_validate_json(text)

    def _write(
        self,
        url: str,
        token: str,
        request: BaseModel,
        timeout: float,
        method: str = "PUT",
        exclude: set[str] | None = None,
    ) -> str:
        """A token-guarded write; DriverRefused with the driver's own error for 409 and 422."""
        return self._call(
            method,
            url,
            refusals=(409, 422),
            timeout=timeout,
            content=request.model_dump_json(exclude=exclude),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )

    def _call(self, method: str, url: str, refusals: tuple[int, ...] = (), **kwargs: Any) -> str:
        """The body of a 2xx answer; DriverRefused with the driver's own error for a status in `refusals`."""
        code, text = self._exchange(method, url, **kwargs)
        if code in refusals:
            try:
                error = ApiError.model_validate_json(text).error
            except ValidationError:
                error = text[:300].strip()
            raise DriverRefused(error)
        if code >= 400:
            raise DriverUnavailable(f"{method} {url}: {code} {text[:300].strip()}")
        return text

    def _exchange(self, method: str, url: str, timeout: float | None = None, **kwargs: Any) -> tuple[int, str]:
        """The status code and body of one request, the body read up to MAX_RESPONSE_BYTES and by the deadline."""
        limit = timeout or self.timeout
        deadline = time.monotonic() + limit
        body = bytearray()
        try:
            with self.http.stream(method, url, timeout=limit, **kwargs) as response:
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > MAX_RESPONSE_BYTES:
                        raise DriverUnavailable(f"{method} {url}: answered more than {MAX_RESPONSE_BYTES} bytes")
                    if time.monotonic() > deadline:
                        raise DriverUnavailable(f"{method} {url}: no complete answer within {limit:g} s")
                return response.status_code, body.decode("utf-8", errors="replace")
        except httpx.HTTPError as exc:
            raise DriverUnavailable(f"{method} {url}: {exc.__class__.__name__}: {exc}") from exc

    def close(self) -> None:
        self.http.close()
