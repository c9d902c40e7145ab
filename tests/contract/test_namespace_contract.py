"""A namespace's lifecycle, asserted the same way on the fake and on the real API server and namespace
controller (issue 25): the fake's ``terminate_namespace`` and ``namespace_controller_pass`` are held to what
the real ones do.

A ``DELETE`` of the Namespace marks it Terminating; the namespace controller then deletes its content as each
kind's delete does (a pod with its own grace period, an object with a finalizer kept until the finalizer goes)
and removes the Namespace only once nothing is left. Meanwhile a create in it is refused (403, the
NamespaceLifecycle admission plugin's words), and so is re-creating the Namespace (409); once it is gone its
objects read 404, a create names the missing namespace, and it can be created again.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from dispatch import _kube as k
from dispatch.testing import FakeApiServer

Obj = dict[str, Any]
HOLD = "example.com/hold"


@dataclass
class Lifecycle:
    """A fresh namespace on the fake or the real API server, and one step of its namespace controller."""

    kube: k.Kube
    ns: str
    step: Callable[[], Awaitable[None]]
    """The fake: one ``namespace_controller_pass``. The real one runs on its own: a short wait."""

    async def until(self, what: str, check: Callable[[], Awaitable[bool]], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not await check():
            assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
            await self.step()

    async def raw(self, method: str, path: str, body: Obj | None = None) -> tuple[int, Obj]:
        """The API server's own reply (code and body), so the Status is compared as it was written."""
        reply = await self.kube._client.request(method, path, content=json.dumps(body).encode() if body else None,
                                                headers={"Content-Type": "application/json",
                                                         "Accept": "application/json"})
        return reply.status_code, reply.json()


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.testbed)])
async def life(request: pytest.FixtureRequest) -> AsyncIterator[Lifecycle]:
    ns = f"contract-ns-{uuid.uuid4().hex[:8]}"
    if request.param == "fake":
        server = FakeApiServer()
        kube = k.Kube.connect(namespace=ns, transport=server.transport())

        async def step() -> None:
            server.namespace_controller_pass(ns)
    else:
        kube = k.Kube.connect(namespace=ns, kubeconfig=request.getfixturevalue("testbed_kubeconfig"))

        async def step() -> None:
            await asyncio.sleep(0.5)
    await kube.create(k.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        yield Lifecycle(kube, ns, step)
    finally:
        if request.param == "real":  # whatever a failed run left: nothing may hold the namespace for ever
            for name in ("held", "p"):
                try:
                    if name == "p":
                        await kube.delete(k.PODS, name, grace_seconds=0)
                    else:
                        await kube.merge_patch(k.CONFIGMAPS, name, {"metadata": {"finalizers": None}})
                except Exception:
                    pass
            try:
                await kube.delete(k.NAMESPACES, ns)
            except Exception:
                pass
        await kube.aclose()


def status(code: int, reason: str, message: str, details: Obj) -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "details": details, "code": code}


async def test_a_namespace_is_terminating_until_its_content_is_gone_then_gone_then_created_again(
    life: Lifecycle,
) -> None:
    kube, ns = life.kube, life.ns
    await kube.create(k.CONFIGMAPS, {"metadata": {"name": "held", "finalizers": [HOLD]}, "data": {"v": "1"}})
    await kube.create(k.PODS, {"metadata": {"name": "p"}, "spec": {  # bound to a node no kubelet serves
        "nodeName": "contract-nowhere", "terminationGracePeriodSeconds": 300,
        "containers": [{"name": "c", "image": "example.invalid/none"}]}})

    made = await kube.get(k.NAMESPACES, ns)
    assert made["spec"] == {"finalizers": ["kubernetes"]} and made["status"] == {"phase": "Active"}
    assert made["metadata"]["labels"] == {"kubernetes.io/metadata.name": ns}

    marked = await kube.delete(k.NAMESPACES, ns)
    assert marked["metadata"]["deletionTimestamp"] and "deletionGracePeriodSeconds" not in marked["metadata"]
    assert marked["spec"] == {"finalizers": ["kubernetes"]} and marked["status"]["phase"] == "Terminating"

    # nothing new in it, from anyone: the NamespaceLifecycle admission plugin's refusal
    terminating = {"reason": "NamespaceTerminating", "message": f"namespace {ns} is being terminated",
                   "field": "metadata.namespace"}
    code, body = await life.raw("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "new"}})
    print("CREATE IN A TERMINATING NAMESPACE:", code, json.dumps(body))
    assert (code, body) == (403, status(
        403, "Forbidden", f'configmaps "new" is forbidden: unable to create new content in namespace {ns} '
                          "because it is being terminated",
        {"name": "new", "kind": "configmaps", "causes": [terminating]}))
    code, body = await life.raw("POST", k.TRAINJOBS.path(ns), {
        "apiVersion": k.TRAINJOBS.api_version, "kind": "TrainJob", "metadata": {"name": "new"}, "spec": {}})
    assert (code, body) == (403, status(
        403, "Forbidden", f'trainjobs.trainer.kubeflow.org "new" is forbidden: unable to create new content in '
                          f"namespace {ns} because it is being terminated",
        {"name": "new", "group": "trainer.kubeflow.org", "kind": "trainjobs", "causes": [terminating]}))
    code, body = await life.raw("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    print("RE-CREATE WHILE TERMINATING:", code, json.dumps(body))
    assert (code, body) == (409, status(409, "AlreadyExists", f'object is being deleted: namespaces "{ns}" already '
                                                              "exists", {"name": ns, "kind": "namespaces"}))

    # the controller deletes the pods first, each with its own grace period, and nothing else while one remains
    async def pod_deleted() -> bool:
        return bool((await kube.get(k.PODS, "p"))["metadata"].get("deletionTimestamp"))
    await life.until("the namespace controller deletes the pod", pod_deleted)
    pod = await kube.get(k.PODS, "p")
    print("POD:", json.dumps({key: pod["metadata"].get(key) for key in ("deletionTimestamp",
                                                                         "deletionGracePeriodSeconds")}))
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 300
    for _ in range(4):
        await life.step()
    assert "deletionTimestamp" not in (await kube.get(k.CONFIGMAPS, "held"))["metadata"]
    # what is in it may still change
    assert (await kube.merge_patch(k.CONFIGMAPS, "held", {"data": {"v": "2"}}))["data"] == {"v": "2"}

    # the kubelet's confirmation (here: a force delete); then the rest goes, as each kind's delete does
    await kube.delete(k.PODS, "p", grace_seconds=0)

    async def rest_deleted() -> bool:
        return bool((await kube.get(k.CONFIGMAPS, "held"))["metadata"].get("deletionTimestamp"))
    began = time.monotonic()
    await life.until("the namespace controller deletes the rest once the pods are gone", rest_deleted,
                     timeout=360)
    held = await kube.get(k.CONFIGMAPS, "held")
    print(f"HELD ({time.monotonic() - began:.1f}s after the pod went):",
          json.dumps({key: held["metadata"].get(key) for key in ("deletionTimestamp", "deletionGracePeriodSeconds",
                                                                 "finalizers")}))
    assert held["metadata"]["deletionGracePeriodSeconds"] == 0 and held["metadata"]["finalizers"] == [HOLD]
    # the finalizer alone holds the namespace
    for _ in range(4):
        await life.step()
    namespace = await kube.get(k.NAMESPACES, ns)
    print("NAMESPACE WHILE A FINALIZER HOLDS ITS CONTENT:", json.dumps(namespace["status"]))
    assert namespace["status"]["phase"] == "Terminating"

    await kube.merge_patch(k.CONFIGMAPS, "held", {"metadata": {"finalizers": None}})

    async def gone() -> bool:
        return await kube.get_or_none(k.NAMESPACES, ns) is None
    await life.until("the namespace gone once its content is", gone)
    code, body = await life.raw("GET", f"/api/v1/namespaces/{ns}/configmaps/held")
    assert (code, body) == (404, status(404, "NotFound", 'configmaps "held" not found',
                                        {"name": "held", "kind": "configmaps"}))
    code, body = await life.raw("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "new"}})
    print("CREATE IN A GONE NAMESPACE:", code, json.dumps(body))
    assert (code, body) == (404, status(404, "NotFound", f'namespaces "{ns}" not found',
                                        {"name": ns, "kind": "namespaces"}))

    again = await kube.create(k.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    assert again["status"]["phase"] == "Active" and again["metadata"]["uid"] != marked["metadata"]["uid"]
    await kube.create(k.CONFIGMAPS, {"metadata": {"name": "new"}})
    assert [c["metadata"]["name"] for c in (await kube.list(k.CONFIGMAPS)).items
            if c["metadata"]["name"] != "kube-root-ca.crt"] == ["new"]
