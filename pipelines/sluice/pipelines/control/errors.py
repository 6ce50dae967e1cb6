"""The one way a control API handler answers with an error: raise ApiFailure."""

from __future__ import annotations

from sluice.api.contract import ApiError


class ApiFailure(Exception):
    def __init__(
        self, status: int, message: str, field: str | None = None, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error = ApiError(error=message, field=field)
        self.headers = headers
