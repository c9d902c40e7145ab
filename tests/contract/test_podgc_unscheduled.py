"""A deleted pod that was never scheduled, kept by a finalizer, is marked Failed by PodGC: the real one and the fake.

The campaign's two pods held by the Job controller's finalizer (issue 34) read ``Failed``: PodGC marks a deleted pod
with no node Failed, adding no condition (``gcUnscheduledTerminating``). The API server gives a pod that is not
bound no grace period at its delete. dispatch's ``not-scheduled`` proof does not read the phase; the fake writes it
so that what status shows of such a pod is what the real cluster shows.
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
POD: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "u", "finalizers": [HOLD]},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": "dispatch-contract-no-such-node"},
                     "containers": [{"name": "c", "image": "example.invalid/train"}]}}


def story(get: Callable[[], Obj], delete: Callable[[], object], until: Callable[[str, Callable[[], bool]], None]
          ) -> None:
    before = {c["type"] for c in (get().get("status") or {}).get("conditions") or []}
    delete()
    deleted = get()
    assert deleted["metadata"].get("deletionTimestamp")
    assert int(deleted["metadata"].get("deletionGracePeriodSeconds") or 0) == 0   # not bound: no grace period
    until("PodGC's Failed", lambda: (get().get("status") or {}).get("phase") == "Failed")
    after = get()
    assert {c["type"] for c in after["status"].get("conditions") or []} == before, after["status"]  # none added
    assert after["metadata"].get("finalizers") == [HOLD]


def test_the_fakes_podgc_marks_a_deleted_unscheduled_pod_failed_as_the_real_one() -> None:
    cluster = FakeCluster()
    cluster.add_node("node-0")
    srv = cluster.server
    srv.create("", "pods", "default", json.loads(json.dumps(POD)))

    def get() -> Obj:
        got = srv.get("", "pods", "default", "u")
        assert got is not None
        return got

    def until(what: str, cond: Callable[[], bool]) -> None:
        for _ in range(3):
            if cond():
                return
            cluster.step()
        raise AssertionError(f"the fake never showed {what}")

    story(get, lambda: srv.delete("", "pods", "default", "u"), until)


@pytest.mark.testbed
def test_the_real_podgc_marks_a_deleted_unscheduled_pod_failed(testbed_kubeconfig: str) -> None:
    from dispatch import testbed

    ns = f"podgc-{uuid.uuid4().hex[:6]}"
    testbed.kubectl("create", "namespace", ns)

    def get() -> Obj:
        out: Obj = json.loads(testbed.kubectl("get", "pod", "u", "-n", ns, "-o", "json").stdout)
        return out

    def until(what: str, cond: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 60   # PodGC passes every 20 s
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"the real control plane never showed {what}")
            time.sleep(1)

    try:
        testbed.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(POD))
        story(get, lambda: testbed.kubectl("delete", "pod", "u", "-n", ns, "--wait=false"), until)
    finally:
        testbed.kubectl("patch", "pod", "u", "-n", ns, "--type=json", "-p",
                        '[{"op":"remove","path":"/metadata/finalizers"}]', check=False)
        testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)
