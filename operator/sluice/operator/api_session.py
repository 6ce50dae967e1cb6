"""The operator's login to the API server, and kopf's session with a bound on its concurrent requests.

Login: the pod's service account, else the kubeconfig (KUBECONFIG or ~/.kube/config), with kopf's own two
logins. A kubeconfig must hold the credentials (a token, a client certificate, a user and password): no exec
plugin is run, so out of a cluster that needs one, get a token first.

kopf's built-in session sets no connection limit. In a burst of apps on a busy API server its patches and
event posts piled up: `make bench-operator` counted about 580 TLS connections open at once, each with a
256 KB read buffer, so the operator's memory peaked with them and stayed fragmented after. Here every request
but a watch waits for one of a fixed number of slots. Watch streams are long-lived and take no slot: they
could otherwise hold every slot and stop all other requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

import aiohttp
import kopf

MAX_CONCURRENT_REQUESTS = 16


def bounded_requests(limit: int) -> aiohttp.ClientMiddlewareType:
    """An aiohttp middleware: at most `limit` requests other than watches wait for their response at once."""
    slots = asyncio.Semaphore(limit)

    async def middleware(request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
        if request.url.query.get("watch") == "true":
            return await handler(request)
        async with slots:
            return await handler(request)

    return middleware


def session_for(info: kopf.ConnectionInfo, limit: int = MAX_CONCURRENT_REQUESTS) -> kopf.AiohttpSession:
    """The session kopf would make from these credentials, with the bound (kopf closes it on re-login)."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        proxy=info.proxy_url,
        trust_env=info.trust_env,
        middlewares=(bounded_requests(limit),),
    )
    return kopf.AiohttpSession(
        aiohttp_session=session,
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
    )


def credentials(settings: kopf.OperatorSettings | None = None) -> kopf.ConnectionInfo:
    """The one login of the operator: kopf's session and the reconciler's client both start from it."""
    settings = settings or kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings)
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if info is not None and host and port:  # as client-go does in a pod: the service's address, no DNS lookup
        info = dataclasses.replace(info, server=f"https://{f'[{host}]' if ':' in host else host}:{port}")
    info = info or kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.LoginError("no service account token in this pod and no kubeconfig (KUBECONFIG, ~/.kube/config)")
    return info


@kopf.on.login()
async def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.AiohttpSession:
    return session_for(credentials(settings))
