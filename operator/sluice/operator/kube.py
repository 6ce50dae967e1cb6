"""The reconciler's Kubernetes API client: plain JSON over httpx, from the worker threads.

The reconciler needs a handful of calls on whole objects (server-side apply, get, list by label, merge patch,
create, delete). The official `kubernetes` package cost the operator 15 MB of imports and built a model
object for every field of every answer; this client keeps the JSON as it comes.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import kopf

from .api_session import credentials

APPLY = "application/apply-patch+yaml"  # server-side apply takes JSON too (YAML's subset)
MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    """The API server refused a request; `status` is its HTTP status, the message its own."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class KindNotServed(Exception):
    """The API server serves no such kind: its CRD (or its API group) is not installed."""


class Kube:
    def __init__(self, info: kopf.ConnectionInfo | None = None, timeout: float = 30.0) -> None:
        self._info = info
        self._timeout = timeout
        self._http = self._client(info or credentials())
        self._relogin = threading.Lock()
        self._kinds: dict[tuple[str, str], tuple[str, bool]] = {}  # (apiVersion, kind) -> (plural, namespaced)

    def _client(self, info: kopf.ConnectionInfo) -> httpx.Client:
        return httpx.Client(
            base_url=info.server,
            verify=info.as_ssl_context(),
            headers=info.as_http_headers(),
            proxy=info.proxy_url,
            trust_env=info.trust_env,
            timeout=self._timeout,
        )

    # ------------------------------------------------------------------------------ calls
    def apply(self, body: dict[str, Any], field_manager: str) -> dict[str, Any]:
        meta = body["metadata"]
        path = self._path(body["apiVersion"], body["kind"], meta.get("namespace"), meta["name"])
        params = {"fieldManager": field_manager, "force": "true"}
        return self._request("PATCH", path, json=body, params=params, content_type=APPLY)

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return self._request("GET", self._path(api_version, kind, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str | None, label_selector: str) -> list[dict[str, Any]]:
        answer = self._request(
            "GET", self._path(api_version, kind, namespace), params={"labelSelector": label_selector}
        )
        return answer.get("items") or []

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        path = self._path(body["apiVersion"], body["kind"], body["metadata"].get("namespace"))
        return self._request("POST", path, json=body)

    def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        patch: dict[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386): a list is replaced whole, a null removes the field."""
        path = self._path(api_version, kind, namespace, name)
        path = f"{path}/{subresource}" if subresource else path
        return self._request("PATCH", path, json=patch, content_type=MERGE_PATCH)

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> None:
        """Gone already is fine."""
        try:
            self._request("DELETE", self._path(api_version, kind, namespace, name))
        except KubeError as exc:
            if exc.status != 404:
                raise

    def close(self) -> None:
        self._http.close()

    # -------------------------------------------------------------------------- plumbing
    def _path(self, api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
        plural, namespaced = self._resource(api_version, kind)
        root = _root(api_version)
        path = f"{root}/namespaces/{namespace}/{plural}" if namespaced and namespace else f"{root}/{plural}"
        return f"{path}/{name}" if name else path

    def _resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        """The kind's plural and scope, from the API server's discovery of its group version (cached)."""
        key = (api_version, kind)
        if key not in self._kinds:
            try:
                resources = self._request("GET", _root(api_version)).get("resources") or []
            except KubeError as exc:
                if exc.status == 404:
                    raise KindNotServed(f"the API server serves no {api_version}") from exc
                raise
            for resource in resources:
                if "/" not in resource["name"]:  # not a subresource
                    self._kinds.setdefault((api_version, resource["kind"]), (resource["name"], resource["namespaced"]))
            if key not in self._kinds:
                raise KindNotServed(f"the API server serves no {kind} in {api_version}")
        return self._kinds[key]

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        headers = {"Content-Type": content_type} if content_type else None
        http = self._http
        response = http.request(method, path, json=json, params=params, headers=headers)
        if response.status_code == 401:  # an expired token (a service account's is rotated): log in again
            http = self._login_again(http)
            response = http.request(method, path, json=json, params=params, headers=headers)
        if response.status_code >= 400:
            raise KubeError(response.status_code, _message(response))
        return response.json() if response.content else {}

    def _login_again(self, stale: httpx.Client) -> httpx.Client:
        with self._relogin:
            if self._http is stale:  # else another thread did it already (a request may still be on the old one)
                self._http = self._client(self._info or credentials())
            return self._http


def _root(api_version: str) -> str:
    """The API path of a group version (the core group's is /api/v1)."""
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


def _message(response: httpx.Response) -> str:
    """The API server's own message (its Status object), else the status line."""
    try:
        message = response.json().get("message")
    except ValueError:
        message = None
    return message or f"{response.status_code} {response.reason_phrase}"
