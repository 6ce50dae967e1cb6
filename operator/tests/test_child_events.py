"""Which child watch events reach a worker thread (the rest are dropped in kopf's event loop)."""

import kopf
import pytest

from sluice.operator.handlers import _drifted
from sluice.operator.names import APP_LABEL


def child(app: str | None, namespace: str = "ns") -> kopf.Body:
    labels = {} if app is None else {APP_LABEL: app}
    return kopf.Body({"metadata": {"name": "c", "namespace": namespace, "labels": labels}})


@pytest.mark.parametrize(
    ("event_type", "body", "handled", "expected"),
    [
        ("MODIFIED", child("app"), {("ns", "app")}, True),
        ("DELETED", child("app"), {("ns", "app")}, True),
        ("ADDED", child("app"), {("ns", "app")}, False),  # our own creations
        (None, child("app"), {("ns", "app")}, False),  # the initial listing
        ("MODIFIED", child("app", "other"), {("ns", "app")}, False),  # same name, another namespace
        ("MODIFIED", child("app"), set(), False),  # an app this replica has not handled (yet)
        ("MODIFIED", child(None), {("ns", "app")}, False),  # no app label
    ],
)
def test_only_an_edit_or_delete_of_a_handled_apps_child_is_drift(event_type, body, handled, expected):
    memo = kopf.Memo()
    memo.apps = handled
    assert _drifted(event={"type": event_type, "object": dict(body)}, body=body, memo=memo) is expected
