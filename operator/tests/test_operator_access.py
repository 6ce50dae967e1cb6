"""The operator's rights as a reconcile pass uses them (fakes at the I/O seam, fakes.py): the driver's account is
bound to the chart's driver ClusterRole (never a Role with the operator's own verbs); cluster-wide, the operator
binds its app-namespace role to itself where it handles an app, once; apps in a denied namespace are refused.
Against a real API server's RBAC: e2e/tests/test_chart.py (kubectl auth can-i, the operator as its account)."""

from __future__ import annotations

from fakes import APP, NAMESPACE, app_manifest, reconcile

from sluice.operator.cluster import ACCESS_REFRESH_SECONDS
from sluice.operator.reconciler import Reconciler
from sluice.operator.settings import Access, Settings

ACCESS = Access(
    driver_cluster_role="rel-spark-driver",
    app_namespace_cluster_role="rel-app-namespace",
    service_account=("sluice-system", "rel"),
)


def test_the_driver_is_bound_to_the_charts_role_and_the_operator_binds_itself_once(world) -> None:
    _, kube, driver = world
    reconciler = Reconciler(kube=kube, driver_client=driver, settings=Settings(access=ACCESS))  # type: ignore[arg-type]
    reconcile(reconciler, app_manifest("word != ''"), clock=1000.0)
    own = kube.objects[("RoleBinding", NAMESPACE, "rel-app-namespace")]
    assert own["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "rel-app-namespace",
    }
    assert own["subjects"] == [{"kind": "ServiceAccount", "namespace": "sluice-system", "name": "rel"}]
    drivers = kube.objects[("RoleBinding", NAMESPACE, f"{APP}-spark")]
    assert drivers["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "rel-spark-driver",
    }
    assert not [key for key in kube.objects if key[0] == "Role"]
    assert kube.access_reviews[0]["resourceAttributes"]["namespace"] == NAMESPACE  # waited for its rights

    del kube.objects[("RoleBinding", NAMESPACE, "rel-app-namespace")]
    reconcile(reconciler, app_manifest("word != ''"), clock=1010.0)
    assert ("RoleBinding", NAMESPACE, "rel-app-namespace") not in kube.objects  # not on every pass
    reconcile(reconciler, app_manifest("word != ''"), clock=1000.0 + ACCESS_REFRESH_SECONDS)
    assert ("RoleBinding", NAMESPACE, "rel-app-namespace") in kube.objects  # a namespace made anew gets it back


def test_an_app_in_a_denied_namespace_is_refused_and_nothing_is_made(world) -> None:
    _, kube, driver = world
    reconciler = Reconciler(kube=kube, driver_client=driver, settings=Settings(access=ACCESS))  # type: ignore[arg-type]
    manifest = app_manifest("word != ''")
    manifest["metadata"]["namespace"] = "kube-system"
    app = reconcile(reconciler, manifest, clock=1000.0)
    assert set(kube.objects) == {("StreamingApp", "kube-system", manifest["metadata"]["name"])}, "nothing made"
    valid = next(c for c in app["status"]["conditions"] if c["type"] == "Valid")
    assert valid["message"] == "metadata.namespace: apps may not run in kube-system (the chart's deniedNamespaces)"
