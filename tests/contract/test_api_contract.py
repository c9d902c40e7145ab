"""What dispatch relies on from the API server, asserted the same way on the fake and on the real one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatch import NotFound, Refused, Unreachable
from dispatch import _kube as k

Obj = dict[str, Any]


def configmap(name: str, labels: dict[str, str] | None = None, **extra: Any) -> Obj:
    meta: Obj = {"name": name, "labels": labels or {}}
    meta.update(extra)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"v": "1"}}


CONFIGMAPS = k.Res("", "v1", "configmaps", "ConfigMap")


def pod(name: str, labels: dict[str, str] | None = None, node: str = "contract-nowhere") -> Obj:
    """A pod bound to a node no kubelet serves: it stays Pending, and deletion stays graceful."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 300,
                 "containers": [{"name": "c", "image": "example.invalid/none"}]},
    }


async def test_create_sets_identity_and_duplicates_are_refused(api: k.Kube) -> None:
    made = await api.create(CONFIGMAPS, configmap("one"))
    assert made["metadata"]["uid"] and made["metadata"]["resourceVersion"]
    with pytest.raises(Refused) as err:
        await api.create(CONFIGMAPS, configmap("one"))
    assert err.value.reason == "AlreadyExists"
    with pytest.raises(NotFound):
        await api.get(CONFIGMAPS, "missing")


async def test_a_write_conditioned_on_a_stale_resource_version_is_a_conflict(api: k.Kube) -> None:
    made = await api.create(CONFIGMAPS, configmap("rv"))
    rv = made["metadata"]["resourceVersion"]
    fresh = await api.merge_patch(CONFIGMAPS, "rv", {"metadata": {"resourceVersion": rv}, "data": {"v": "2"}})
    assert fresh["metadata"]["resourceVersion"] != rv
    with pytest.raises(Unreachable) as err:
        await api.merge_patch(CONFIGMAPS, "rv", {"metadata": {"resourceVersion": rv}, "data": {"v": "3"}})
    assert err.value.code == 409
    assert (await api.get(CONFIGMAPS, "rv"))["data"]["v"] == "2"


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=a", ["a1", "a2"]),
        ("app==a", ["a1", "a2"]),
        ("app!=a", ["b1", "none"]),
        ("app in (a,b)", ["a1", "a2", "b1"]),
        ("app notin (a)", ["b1", "none"]),
        ("app", ["a1", "a2", "b1"]),
        ("!app", ["none"]),
        ("app=a,tier=x", ["a1"]),
    ],
)
async def test_label_selectors(api: k.Kube, selector: str, expected: list[str]) -> None:
    for name, labels in (("a1", {"app": "a", "tier": "x"}), ("a2", {"app": "a"}), ("b1", {"app": "b"}),
                         ("none", {})):
        await api.create(CONFIGMAPS, configmap(name, labels))
    found = await api.list(CONFIGMAPS, labels=selector)
    names = sorted(o["metadata"]["name"] for o in found.items if o["metadata"]["name"] != "kube-root-ca.crt")
    assert names == expected


async def test_paging_with_continue_returns_one_snapshot(api: k.Kube) -> None:
    for i in range(5):
        await api.create(CONFIGMAPS, configmap(f"p{i}", {"page": "yes"}))
    path = CONFIGMAPS.path(api.namespace)
    first = await api._send("GET", path, params={"limit": "2", "labelSelector": "page=yes"}, list_call=True)
    assert len(first["items"]) == 2 and first["metadata"].get("continue")
    await api.create(CONFIGMAPS, configmap("p9", {"page": "yes"}))  # after the snapshot: never shown
    await api.delete(CONFIGMAPS, "p4")  # deleted after the snapshot: still shown
    names = [o["metadata"]["name"] for o in first["items"]]
    token = first["metadata"]["continue"]
    while token:
        page = await api._send("GET", path, params={"limit": "2", "continue": token, "labelSelector": "page=yes"},
                               list_call=True)
        names += [o["metadata"]["name"] for o in page["items"]]
        token = page["metadata"].get("continue")
    assert names == ["p0", "p1", "p2", "p3", "p4"]
    whole = await api.list(CONFIGMAPS, labels="page=yes", limit=2)
    assert [o["metadata"]["name"] for o in whole.items] == ["p0", "p1", "p2", "p3", "p9"]


async def test_paging_across_namespaces_follows_the_storage_order(api: k.Kube) -> None:
    """The storage orders a kind's objects by ``namespace/name`` as text, so a namespace named like this
    one plus ``-b`` comes first ('-' sorts before '/'), and a paged list over every namespace returns each
    object once in that order (the continue token resumes after the last name returned)."""
    other = f"{api.namespace}-b"
    await api.create(k.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}})
    try:
        label = {"cross": api.namespace}
        for name in ("x1", "x2"):
            await api.create(CONFIGMAPS, configmap(name, label))
            await api.create(CONFIGMAPS, configmap(name, label), namespace=other)
        listed = await api.list(CONFIGMAPS, labels=f"cross={api.namespace}", limit=1, all_namespaces=True)
        assert listed.requests >= 4
        assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in listed.items] == [
            (other, "x1"), (other, "x2"), (api.namespace, "x1"), (api.namespace, "x2")]
    finally:
        try:
            await api.delete(k.NAMESPACES, other)
        except NotFound:
            pass


async def test_continue_with_a_resource_version_is_rejected(api: k.Kube) -> None:
    for i in range(3):
        await api.create(CONFIGMAPS, configmap(f"c{i}", {"c": "1"}))
    path = CONFIGMAPS.path(api.namespace)
    first = await api._send("GET", path, params={"limit": "1", "labelSelector": "c=1"}, list_call=True)
    with pytest.raises(Refused):
        await api._send("GET", path, params={"limit": "1", "continue": first["metadata"]["continue"],
                                             "resourceVersion": first["metadata"]["resourceVersion"],
                                             "resourceVersionMatch": "Exact"}, list_call=True, retry=False)


async def test_exact_read_returns_the_collection_at_that_resource_version(api: k.Kube) -> None:
    await api.create(CONFIGMAPS, configmap("e1", {"e": "1"}))
    then = await api.list(CONFIGMAPS, labels="e=1")
    await api.create(CONFIGMAPS, configmap("e2", {"e": "1"}))
    await api.merge_patch(CONFIGMAPS, "e1", {"data": {"v": "changed"}})
    old = await api.list(CONFIGMAPS, labels="e=1", resource_version=then.resource_version, exact=True)
    assert old.resource_version == then.resource_version
    assert [(o["metadata"]["name"], o["data"]["v"]) for o in old.items] == [("e1", "1")]
    now = await api.list(CONFIGMAPS, labels="e=1")
    assert sorted(o["metadata"]["name"] for o in now.items) == ["e1", "e2"]


async def test_status_subresource_is_isolated(api: k.Kube) -> None:
    await api.create(k.PODS, pod("iso"))
    await api.merge_patch(k.PODS, "iso", {"status": {"phase": "Running"},
                                          "metadata": {"labels": {"touched": "yes"}}})
    main = await api.get(k.PODS, "iso")
    assert main["metadata"]["labels"]["touched"] == "yes"
    assert (main.get("status") or {}).get("phase") != "Running"
    await api.merge_patch(k.PODS, "iso", {"status": {"phase": "Running"}, "spec": {"activeDeadlineSeconds": 5},
                                          "metadata": {"labels": {"via": "status"}}}, sub="status")
    after = await api.get(k.PODS, "iso")
    assert after["status"]["phase"] == "Running"
    assert "activeDeadlineSeconds" not in after["spec"]
    assert after["metadata"]["labels"]["via"] == "status"  # pods take metadata through /status (measured)


async def test_custom_resource_status_subresource_ignores_spec_and_metadata(api: k.Kube) -> None:
    await api.create(k.TRAINJOBS, {
        "apiVersion": k.TRAINJOBS.api_version, "kind": "TrainJob", "metadata": {"name": "st"},
        "spec": {"suspend": True, "runtimeRef": {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org",
                                                 "kind": "ClusterTrainingRuntime"}},
    })
    cond = {"type": "example.com/X", "status": "True", "reason": "R", "message": "m",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}
    out = await api.merge_patch(k.TRAINJOBS, "st", {"metadata": {"labels": {"via": "status"}},
                                                    "spec": {"suspend": False},
                                                    "status": {"conditions": [cond]}}, sub="status")
    assert "via" not in (out["metadata"].get("labels") or {})
    assert out["spec"]["suspend"] is True
    assert "example.com/X" in [c["type"] for c in out["status"]["conditions"]]


async def test_graceful_pod_deletion_keeps_the_pod_terminating(api: k.Kube) -> None:
    await api.create(k.PODS, pod("grace"))
    await api.delete(k.PODS, "grace")
    terminating = await api.get(k.PODS, "grace")
    assert terminating["metadata"]["deletionTimestamp"]
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 300
    listed = await api.list(k.PODS)
    assert "grace" in [o["metadata"]["name"] for o in listed.items]  # lists include Terminating pods
    await api.delete(k.PODS, "grace", grace_seconds=0)
    with pytest.raises(NotFound):
        await api.get(k.PODS, "grace")


async def test_unscheduled_pods_are_deleted_at_once(api: k.Kube) -> None:
    body = pod("unbound")
    del body["spec"]["nodeName"]
    body["spec"]["schedulerName"] = "contract-no-such-scheduler"
    await api.create(k.PODS, body)
    await api.delete(k.PODS, "unbound")
    with pytest.raises(NotFound):
        await api.get(k.PODS, "unbound")


async def test_finalizers_hold_a_deleted_object_until_removed(api: k.Kube) -> None:
    await api.create(CONFIGMAPS, configmap("fin", finalizers=["example.com/hold"]))
    await api.delete(CONFIGMAPS, "fin")
    held = await api.get(CONFIGMAPS, "fin")
    assert held["metadata"]["deletionTimestamp"]
    await api.merge_patch(CONFIGMAPS, "fin", {"metadata": {"finalizers": None}})
    with pytest.raises(NotFound):
        await api.get(CONFIGMAPS, "fin")


async def test_server_side_apply_merges_list_map_entries_by_key(api: k.Kube) -> None:
    """Two managers own two entries of one list-map (pod conditions, keyed by type); neither clobbers."""
    await api.create(k.PODS, pod("ssa"))
    for manager, ctype in (("contract-a", "example.com/A"), ("contract-b", "example.com/B")):
        await api.apply(k.PODS, "ssa", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ssa"},
            "status": {"conditions": [{"type": ctype, "status": "True"}]},
        }, sub="status", field_manager=manager)
    got = await api.get(k.PODS, "ssa")
    types = {c["type"] for c in got["status"]["conditions"]}
    assert {"example.com/A", "example.com/B"} <= types
    # a manager that stops applying its entry removes it, and only it
    await api.apply(k.PODS, "ssa", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ssa"},
        "status": {"conditions": [{"type": "example.com/A", "status": "False"}]},
    }, sub="status", field_manager="contract-a")
    got = await api.get(k.PODS, "ssa")
    conds = {c["type"]: c["status"] for c in got["status"]["conditions"]}
    assert conds["example.com/A"] == "False" and conds["example.com/B"] == "True"


async def test_server_side_apply_with_a_stale_resource_version_is_a_conflict(api: k.Kube) -> None:
    made = await api.create(CONFIGMAPS, configmap("ssarv"))
    await api.merge_patch(CONFIGMAPS, "ssarv", {"data": {"v": "2"}})
    with pytest.raises(Unreachable) as err:
        await api.apply(CONFIGMAPS, "ssarv", {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "ssarv", "resourceVersion": made["metadata"]["resourceVersion"]},
            "data": {"w": "x"},
        })
    assert err.value.code == 409


async def test_watch_reports_changes_after_a_resource_version(api: k.Kube) -> None:
    start = await api.list(CONFIGMAPS, labels="w=1")
    seen: list[tuple[str, str]] = []

    async def watch() -> None:
        async for etype, obj in api.watch(CONFIGMAPS, resource_version=start.resource_version, labels="w=1",
                                          timeout_seconds=10):
            if etype == "BOOKMARK":
                continue
            seen.append((etype, obj["metadata"]["name"]))
            if len(seen) == 3:
                return

    task = asyncio.create_task(watch())
    await asyncio.sleep(0.3)
    await api.create(CONFIGMAPS, configmap("w1", {"w": "1"}))
    await api.merge_patch(CONFIGMAPS, "w1", {"data": {"v": "2"}})
    await api.delete(CONFIGMAPS, "w1")
    await asyncio.wait_for(task, 15)
    assert seen == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]
