"""kopf's watches hand on objects without their managed fields (what kopf keeps of each app shrinks with them)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kopf._cogs.clients import watching

from sluice.operator import watch_transform


def app_event(kind: str | None) -> dict[str, Any]:
    return {
        "type": kind,
        "object": {
            "metadata": {
                "name": "app",
                "annotations": {"sluice.dev/last-handled-configuration": "{}"},
                "managedFields": [{"manager": "kopf", "fieldsV1": {"f:metadata": {}}}],
            },
            "spec": {"managedFields": "a spec field of that name is the user's"},
        },
    }


def test_an_event_loses_its_objects_managed_fields_and_nothing_else() -> None:
    event = watch_transform.strip_managed_fields(app_event("MODIFIED"))
    assert event["type"] == "MODIFIED"
    assert event["object"]["metadata"] == {
        "name": "app",
        "annotations": {"sluice.dev/last-handled-configuration": "{}"},
    }
    assert event["object"]["spec"] == {"managedFields": "a spec field of that name is the user's"}
    assert watch_transform.strip_managed_fields(watching.Bookmark.LISTED) is watching.Bookmark.LISTED
    assert watch_transform.strip_managed_fields({"type": "ERROR", "object": "gone"}) == {
        "type": "ERROR",
        "object": "gone",
    }


def test_kopfs_listing_and_watching_pass_through_the_wrapped_seam(monkeypatch: pytest.MonkeyPatch) -> None:
    """infinite_watch (what kopf's queueing consumes) calls continuous_watch by its module name: both the initial
    listing (type None) and the watch events come through the wrapper, and closing the stream closes kopf's."""
    closed = []

    async def kopf_watch(**kwargs: Any):
        try:
            yield app_event(None)
            yield watching.Bookmark.LISTED
            yield app_event("ADDED")
        finally:
            closed.append(kwargs)

    monkeypatch.setattr(watching, "continuous_watch", kopf_watch)
    assert "continuous_watch" in watching.infinite_watch.__code__.co_names, "kopf's seam moved"
    watch_transform.install()
    watch_transform.install()  # again: wrapped once

    async def first_two() -> list[Any]:
        stream = watching.continuous_watch(settings=None, resource="apps", namespace=None, operator_pause_waiter=None)
        events = [await anext(stream), await anext(stream)]
        await stream.aclose()
        return events

    listed, bookmark = asyncio.run(first_two())
    assert "managedFields" not in listed["object"]["metadata"] and listed["type"] is None
    assert bookmark is watching.Bookmark.LISTED
    assert closed == [{"settings": None, "resource": "apps", "namespace": None, "operator_pause_waiter": None}]
