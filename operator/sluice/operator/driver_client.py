"""Client of a driver's control API (served by sluice.pipelines.control; models in sluice.api.contract).

The operator talks to the driver pod directly (its IP, the control port): the API server's service proxy
drops the Authorization header, and the app's NetworkPolicy admits the control port from the operator's
pods only.
"""

from __future__ import annotations

from typing import Literal

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


class DriverClient:
    def __init__(self, timeout: float = 5.0) -> None:
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
        try:
            response = self.http.request(
                method,
                url,
                content=request.model_dump_json(exclude=exclude),
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                timeout=timeout,
            )
        except httpx.HTTPError as exc:
            raise DriverUnavailable(f"{method} {url}: {exc.__class__.__name__}: {exc}") from exc
        if response.status_code in (409, 422):
            try:
                error = ApiError.model_validate_json(response.text).error
            except ValidationError:
                error = response.text[:300].strip()
            raise DriverRefused(error)
        if response.status_code >= 400:
            raise DriverUnavailable(f"{method} {url}: {response.status_code} {response.text[:300].strip()}")
        return response.text

    def _call(self, method: str, url: str, **kwargs: object) -> str:
        try:
            response = self.http.request(method, url, **kwargs)  # type: ignore[arg-type]
        except httpx.HTTPError as exc:
            raise DriverUnavailable(f"{method} {url}: {exc.__class__.__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise DriverUnavailable(f"{method} {url}: {response.status_code} {response.text[:300].strip()}")
        return response.text

    def close(self) -> None:
        self.http.close()
