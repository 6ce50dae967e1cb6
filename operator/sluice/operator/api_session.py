"""kopf's connection to the API server: kopf's own login, with a bound on its concurrent requests.

kopf's built-in session sets no connection limit. In a burst of apps on a busy API server its patches and
event posts piled up: `make bench-operator` counted about 580 TLS connections open at once, each with a
256 KB read buffer, so the operator's memory peaked with them and stayed fragmented after. Here every request
but a watch waits for one of a fixed number of slots. Watch streams are long-lived and take no slot: they
could otherwise hold every slot and stop all other requests.
"""

from __future__ import annotations

import asyncio
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


@kopf.on.login()
async def login(**kwargs: Any) -> kopf.AiohttpSession | None:
    """kopf's own logins in kopf's order (the Kubernetes client's config, then the pod's service account, then
    the kubeconfig), and the bounded session from what they find."""
    info = (
        kopf.login_via_client(**kwargs)
        or kopf.login_with_service_account(**kwargs)
        or kopf.login_with_kubeconfig(**kwargs)
    )
    return session_for(info) if info is not None else None
