"""Objects as kopf keeps them, without their managed fields: kopf's counterpart of client-go's
TransformStripManagedFields, which Go operators set on their informers' caches.

kopf keeps the last body of every object with a timer (each app's, for its tick and resync), and the API server
puts its field-ownership bookkeeping in each body (metadata.managedFields): 40% of a Pending app's JSON, more with
each field manager and list-map key (the conditions, the nodes, the topics). The operator never reads it and writes
no server-side apply. kopf has no transform setting, so this wraps its watch stream, the one seam that both its
listing and its watching pass through (kopf is pinned; test_watch_transform fails if the seam moves).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from kopf._cogs.clients import watching


def strip_managed_fields(raw_event: Any) -> Any:
    """The event with its object's metadata.managedFields dropped (a bookmark passes as it is)."""
    body = raw_event.get("object") if isinstance(raw_event, dict) else None
    metadata = body.get("metadata") if isinstance(body, dict) else None
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
    return raw_event


def install() -> None:
    """From now on, kopf's watches hand on objects without their managed fields (once; again is a no-op)."""
    kopf_watch = watching.continuous_watch
    if getattr(kopf_watch, "strips_managed_fields", False):
        return

    async def continuous_watch(**kwargs: Any) -> AsyncIterator[Any]:
        # Closing this stream closes kopf's (it is an async generator, though typed as an iterator).
        async with contextlib.aclosing(cast(AsyncGenerator[Any, None], kopf_watch(**kwargs))) as stream:
            async for raw_event in stream:
                yield strip_managed_fields(raw_event)

    continuous_watch.strips_managed_fields = True  # type: ignore[attr-defined]
    watching.continuous_watch = continuous_watch
