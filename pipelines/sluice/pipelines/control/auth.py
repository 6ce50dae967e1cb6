"""The bearer token the control API's writes need."""

from __future__ import annotations

import hmac
from pathlib import Path

from .errors import ApiFailure

NO_TOKEN = "writes are disabled: no control token"


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, None for anything else."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class ControlToken:
    """The token is the content (stripped) of a file. It is read at each check, so a rotated Kubernetes
    Secret (swapped in place in the mounted volume) takes effect at once; writes are rare."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def expected(self) -> str:
        if self.path is None:
            raise ApiFailure(403, NO_TOKEN)
        try:
            token = Path(self.path).read_text().strip()
        except OSError as exc:
            raise ApiFailure(403, f"{NO_TOKEN}: cannot read {self.path} ({exc.strerror})") from exc
        if not token:
            raise ApiFailure(403, f"{NO_TOKEN}: {self.path} is empty")
        return token

    def check(self, authorization: str | None) -> None:
        """Return when the header carries the token; raise ApiFailure (401 or 403) otherwise."""
        expected = self.expected()
        given = bearer_token(authorization)
        if given is None or not hmac.compare_digest(given.encode(), expected.encode()):
            raise ApiFailure(401, "missing or wrong bearer token", headers=(("WWW-Authenticate", "Bearer"),))
