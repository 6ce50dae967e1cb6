"""kopf's session to the API server: at most a fixed number of requests at once, watches apart.

Against a real HTTP server on localhost that counts the requests it is answering at the same time.
"""

from __future__ import annotations

import asyncio

import kopf
from aiohttp import web

from sluice.operator.api_session import session_for

LIMIT = 4


class CountingServer:
    """Answers GET /slow after a short wait and holds GET /watch?watch=true open until released."""

    def __init__(self) -> None:
        self.answering = 0
        self.most_at_once = 0
        self.watching = 0
        self.release_watches = asyncio.Event()

    async def slow(self, request: web.Request) -> web.Response:
        self.answering += 1
        self.most_at_once = max(self.most_at_once, self.answering)
        try:
            await asyncio.sleep(0.05)
        finally:
            self.answering -= 1
        return web.json_response({"ok": True})

    async def watch(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        self.watching += 1
        await self.release_watches.wait()
        self.watching -= 1
        return response

    async def start(self) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_get("/slow", self.slow)
        app.router.add_get("/watch", self.watch)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner, f"http://127.0.0.1:{port}"


async def _requests_at_once(requests: int) -> tuple[int, list[int]]:
    server = CountingServer()
    runner, address = await server.start()
    context = session_for(kopf.ConnectionInfo(server=address), limit=LIMIT)
    session = context.aiohttp_session
    try:

        async def get() -> int:
            async with session.get(f"{address}/slow") as response:
                await response.json()
                return response.status

        statuses = await asyncio.gather(*(get() for _ in range(requests)))
    finally:
        await session.close()
        await runner.cleanup()
    return server.most_at_once, statuses


def test_requests_wait_for_a_slot() -> None:
    most_at_once, statuses = asyncio.run(_requests_at_once(40))
    assert statuses == [200] * 40
    assert most_at_once == LIMIT  # reached, never passed


async def _request_beside_open_watches() -> tuple[int, int]:
    server = CountingServer()
    runner, address = await server.start()
    session = session_for(kopf.ConnectionInfo(server=address), limit=LIMIT).aiohttp_session
    watches = []
    try:
        for _ in range(LIMIT + 2):  # more open watches than slots
            watches.append(await session.get(f"{address}/watch", params={"watch": "true"}))
        async with asyncio.timeout(5):  # a slot is free although every connection so far is a watch
            async with session.get(f"{address}/slow") as response:
                status = response.status
        return server.watching, status
    finally:
        server.release_watches.set()
        for watch in watches:
            watch.release()
        await session.close()
        await runner.cleanup()


def test_watches_take_no_slot() -> None:
    watching, status = asyncio.run(_request_beside_open_watches())
    assert watching == LIMIT + 2
    assert status == 200


def test_the_session_carries_the_credentials() -> None:
    info = kopf.ConnectionInfo(server="https://api.example:6443", token="t0ken", default_namespace="apps")

    async def build() -> tuple[kopf.AiohttpSession, str | None]:
        context = session_for(info)
        header = context.aiohttp_session.headers.get("Authorization")
        await context.aiohttp_session.close()
        return context, header

    context, header = asyncio.run(build())
    assert header == "Bearer t0ken"
    assert (context.server, context.default_namespace) == ("https://api.example:6443", "apps")
