"""A deleted pod whose last finalizer goes while its grace period runs stays in the API, on the real server as in the
fake (``FakeApiServer.grace_outlasts_finalizers``).

The API server deletes an object on the update that empties its finalizers only when its deletion grace period is
0; a pod deleted gracefully keeps a grace period until its kubelet (or PodGC) deletes it again with 0. So a
controller that takes its finalizer off a pod still stopping (the Job controller counts a deleted pod at once;
dispatch's keeper frees a pod whose end it proved by its Node) does not make the pod go: it goes when its kubelet
confirms the end, or when PodGC force-deletes it. This fake used to drop it at once. The pod here sits on a KWOK
node with the testbed's hold annotation, so no kubelet deletes it while the story looks.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from dispatch.testing import FakeCluster

Obj = dict[str, Any]
HOLD = "dispatch.test/contract-hold"


def pod(node: str, annotations: dict[str, str]) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "finalizers": [HOLD],
                                                           "annotations": annotations},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "c", "image": "example.invalid/train"}]}}


def story(create: Callable[[Obj], object], get: Callable[[], Obj | None], delete: Callable[[int | None], object],
          drop_finalizers: Callable[[], object], pause: Callable[[], object]) -> None:
    create({})
    delete(None)                                   # graceful: the pod's own 30 s
    deleting = get()
    assert deleting is not None and deleting["metadata"].get("deletionTimestamp")
    assert int(deleting["metadata"].get("deletionGracePeriodSeconds") or 0) == 30
    drop_finalizers()
    pause()
    left = get()
    assert left is not None, "the pod went with its last finalizer, its grace period still running"
    assert not left["metadata"].get("finalizers") and left["metadata"].get("deletionTimestamp")
    delete(0)                                      # the kubelet's (or PodGC's) delete
    pause()
    assert get() is None, "a pod with no finalizer, deleted with grace 0, stayed"


def test_the_fakes_api_server_keeps_a_pod_through_its_grace_period_though_its_finalizers_went() -> None:
    cluster = FakeCluster()
    cluster.add_node("node-0")
    srv = cluster.server

    def drop(obj: Obj) -> None:
        obj["metadata"].pop("finalizers", None)

    story(create=lambda _: srv.create("", "pods", "default", pod("node-0", {})),
          get=lambda: srv.get("", "pods", "default", "p"),
          delete=lambda grace: srv.delete("", "pods", "default", "p", grace=grace),
          drop_finalizers=lambda: srv.update("", "pods", "default", "p", drop, status=None, admit=False),
          pause=lambda: None)


@pytest.mark.testbed
def test_the_real_api_server_keeps_a_pod_through_its_grace_period_though_its_finalizers_went(
        testbed_kubeconfig: str) -> None:
    from dispatch import testbed

    ns = f"grace-{uuid.uuid4().hex[:6]}"
    testbed.kubectl("create", "namespace", ns)
    node = testbed.regular_nodes()[0]

    def get() -> Obj | None:
        out = testbed.kubectl("get", "pod", "p", "-n", ns, "-o", "json", "--ignore-not-found")
        return json.loads(out.stdout) if out.stdout.strip() else None

    try:
        story(create=lambda _: testbed.kubectl("create", "-n", ns, "-f", "-",
                                               input=json.dumps(pod(node, {testbed.ANN_HOLD_DELETE: "true"}))),
              get=get,
              delete=lambda grace: testbed.kubectl(
                  "delete", "pod", "p", "-n", ns, "--wait=false",
                  *(["--force", f"--grace-period={grace}"] if grace == 0 else [])),
              drop_finalizers=lambda: testbed.kubectl("patch", "pod", "p", "-n", ns, "--type=json", "-p",
                                                      '[{"op":"remove","path":"/metadata/finalizers"}]'),
              pause=lambda: time.sleep(3))
    finally:
        testbed.kubectl("patch", "pod", "p", "-n", ns, "--type=json", "-p",
                        '[{"op":"remove","path":"/metadata/finalizers"}]', check=False)
        testbed.kubectl("delete", "pod", "p", "-n", ns, "--force", "--grace-period=0", check=False)
        testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)
