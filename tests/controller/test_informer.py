"""The informers' memory and backoff: paged lists into sinks, pods kept as routing signatures, slim
Workloads, and a relist backoff that a list followed at once by a failing watch does not reset."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from dispatch import _kube as k
from dispatch import _names as n
from dispatch._views import POD_FINALIZER
from dispatch.controller import Config, Controller
from dispatch.controller._informer import INITIAL_BACKOFF, MAX_BACKOFF, Informer
from dispatch.controller._metrics import Metrics
from dispatch.controller._queue import WorkQueue
from dispatch.controller._routing import RoutedWorkload, Router
from dispatch.testing import FakeCluster

NS = "default"


class Stop(Exception):
    """Ends an informer's run from inside its backoff."""


class Recorder:
    """A sink that records how lists arrive, and can act once a list completed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.after_list: list[Any] = []

    def begin(self) -> None:
        self.calls.append(("begin", 0))

    def page(self, items: list[dict[str, Any]]) -> None:
        self.calls.append(("page", len(items)))

    def end(self) -> None:
        self.calls.append(("end", 0))
        for hook in self.after_list:
            hook()


def pod(name: str, jobset: str, *, node: str = "node-0", phase: str = "Running", job_id: str = "") -> dict[str, Any]:
    labels = {n.JOBSET_NAME_LABEL: jobset}
    if job_id:
        labels |= {n.LABEL_JOB_ID: job_id, n.LABEL_SUBMISSION: "s1"}
    status: dict[str, Any] = {"phase": phase}
    if phase in ("Succeeded", "Failed"):   # ended as its kubelet reports it: every container terminated
        status["containerStatuses"] = [{"name": "node", "state": {"terminated": {"exitCode": 1}}}]
    return {"metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "node"}]}, "status": status}


def workload(name: str, owner: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"wl-{name}", "resourceVersion": "1",
                     "ownerReferences": [{"apiVersion": f"{n.TRAINER_GROUP}/v1alpha1", "kind": "TrainJob",
                                          "name": owner, "uid": f"tj-{owner}", "controller": True}]},
        "spec": {"podSets": [{"name": "node", "template": {"metadata": {"labels": {
            n.LABEL_JOB_ID: owner, n.LABEL_SUBMISSION: "s1"}}}}]},
        "status": {"admissionChecks": [{"name": "dispatch", "state": "Pending", "message": ""}],
                   "conditions": [{"type": "QuotaReserved", "status": "True"}]},
    }


def drain(queue: WorkQueue) -> set[str]:
    keys = set()
    while len(queue):
        keys.add(queue._items.popleft())
    queue._queued.clear()
    return keys


def informer(cluster: FakeCluster, kube: k.Kube, sink: Recorder, *, page_size: int = 500) -> Informer:
    return Informer(kube, k.PODS, namespace=NS, labels=n.JOBSET_NAME_LABEL, on_list=sink,
                    on_event=lambda etype, obj: None, timeout_seconds=30, metrics=Metrics.create(),
                    page_size=page_size)


def list_calls(cluster: FakeCluster) -> list[dict[str, str]]:
    return [q for m, p, q in cluster.server.requests if m == "GET" and p.endswith("/pods") and "watch" not in q]


async def test_a_list_reaches_the_sink_one_page_at_a_time() -> None:
    cluster = FakeCluster()
    for i in range(23):
        cluster.server.create("", "pods", NS, pod(f"p{i:02d}", "llama-s1"))
    kube = k.Kube.connect(namespace=NS, transport=cluster.transport())
    sink = Recorder()
    inf = informer(cluster, kube, sink, page_size=5)
    sink.after_list.append(lambda: inf.synced.set())
    task = asyncio.create_task(inf.run())
    await asyncio.wait_for(inf.synced.wait(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await kube.aclose()
    assert sink.calls == [("begin", 0), *[("page", 5)] * 4, ("page", 3), ("end", 0)]
    calls = list_calls(cluster)
    assert [q["limit"] for q in calls] == ["5"] * 5
    assert sum("continue" in q for q in calls) == 4


async def run_flapping(cluster: FakeCluster, *, failures: int, status: int, long_after: frozenset[int] = frozenset()
                       ) -> tuple[list[float], Informer]:
    """Every list is followed by a watch that fails at once (``status``), ``failures`` times; the lists
    numbered in ``long_after`` are followed by a watch that ran past the healthy period first."""
    kube = k.Kube.connect(namespace=NS, transport=cluster.transport())
    sink = Recorder()
    inf = informer(cluster, kube, sink)
    now = [1000.0]
    inf.clock = lambda: now[0]
    delays: list[float] = []

    advance = [False]

    def fail_the_watch() -> None:
        cluster.server.inject(method="GET", path=r"/pods$", status=status, times=1)   # the request after the list
        advance[0] = inf.lists in long_after

    def watch_runs_long(method: str, path: str) -> None:
        if advance[0]:   # the watch (the request after the list) "ran" a minute before it failed
            advance[0] = False
            now[0] += 60.0

    sink.after_list.append(fail_the_watch)
    cluster.server.before_request = watch_runs_long

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        if len(delays) >= failures:
            raise Stop

    inf.sleep = sleep
    with pytest.raises(Stop):
        await asyncio.wait_for(inf.run(), 10)
    await kube.aclose()
    return delays, inf


async def test_a_list_followed_at_once_by_a_failing_watch_does_not_reset_the_backoff() -> None:
    cluster = FakeCluster()
    cluster.server.create("", "pods", NS, pod("p0", "llama-s1"))
    delays, inf = await run_flapping(cluster, failures=8, status=500)
    expected = [min(INITIAL_BACKOFF * 2 ** i, MAX_BACKOFF) for i in range(8)]
    assert delays == pytest.approx(expected)
    assert inf.lists == 8 == len(list_calls(cluster))
    watches = [q for m, p, q in cluster.server.requests if m == "GET" and "watch" in q]
    assert len(watches) == 8


async def test_a_watch_that_ran_past_the_healthy_period_starts_the_backoff_afresh() -> None:
    cluster = FakeCluster()
    cluster.server.create("", "pods", NS, pod("p0", "llama-s1"))
    delays, _ = await run_flapping(cluster, failures=6, status=500, long_after=frozenset({4}))
    assert delays == pytest.approx([0.2, 0.4, 0.8, 0.2, 0.4, 0.8])


async def test_a_watch_expiring_right_after_each_list_is_backed_off_too() -> None:
    cluster = FakeCluster()
    cluster.server.create("", "pods", NS, pod("p0", "llama-s1"))
    delays, inf = await run_flapping(cluster, failures=5, status=410)
    assert delays == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2])
    assert inf.lists == 5


def router_with(*workloads: dict[str, Any]) -> tuple[Router, WorkQueue]:
    queue = WorkQueue()
    router = Router(queue, on_change=lambda: None)
    router.set_check_names(frozenset({"dispatch"}))
    router.list_workloads(list(workloads))
    drain(queue)
    return router, queue


def relist(router: Router, selection: str, *pages: list[dict[str, Any]]) -> None:
    index = router.pod_index(selection)
    index.begin()
    for page in pages:
        index.page(page)
    index.end()


def test_pods_are_kept_as_routing_signatures_and_workloads_as_slim_views() -> None:
    router, queue = router_with(workload("wl-a", "a-s1"))
    assert isinstance(router.workloads[f"{NS}/wl-a"], RoutedWorkload)
    assert router.workloads[f"{NS}/wl-a"].hint.owner_uid == "tj-a-s1"
    assert router.workloads[f"{NS}/wl-a"].hint.pod_set_identity == ("a-s1", "s1")
    relist(router, "pods", [pod("a0", "a-s1", job_id="a-s1")], [pod("b0", "b-s1")])
    assert router.pod_index("pods").live["uid-a0"] == ("node-0", True, (NS, "a-s1", "a-s1", "s1"))
    assert drain(queue) == {f"{NS}/wl-a"}   # the first list re-checks every pending Workload


def test_a_pod_both_selections_find_is_kept_as_one_signature() -> None:
    """Both pod selections find a dispatch object's pods: they keep one tuple for such a pod, not two (issue 37:
    controller memory at 100,000 pods); a pod that changed keeps its own new signature."""
    router, _ = router_with(workload("wl-a", "a-s1"))
    relist(router, "pods", [pod("a0", "a-s1", job_id="a-s1"), pod("a1", "a-s1", job_id="a-s1")])
    relist(router, "dispatch-pods", [pod("a0", "a-s1", job_id="a-s1"), pod("a1", "a-s1", job_id="a-s1", node="n-9")])
    by_name, by_ident = router.pod_index("pods").live, router.pod_index("dispatch-pods").live
    assert by_ident["uid-a0"] is by_name["uid-a0"]
    assert by_ident["uid-a1"] == ("n-9", True, (NS, "a-s1", "a-s1", "s1")) != by_name["uid-a1"]
    router.pod_index("pods").on_event("MODIFIED", pod("a1", "a-s1", job_id="a-s1", node="n-9"))
    assert by_name["uid-a1"] is by_ident["uid-a1"]


def test_the_pods_of_one_jobset_share_one_routing_group() -> None:
    """A pod's signature holds its group (namespace, jobset-name, job-id, submission) as one tuple the pods
    of its JobSet share, whichever selection or page found them (issue 37: ~4 MiB at 100,000 pods)."""
    router, queue = router_with(workload("wl-a", "a-s1"))
    relist(router, "pods", [pod("a0", "a-s1", job_id="a-s1")], [pod("a1", "a-s1", job_id="a-s1", node="n-9")])
    relist(router, "dispatch-pods", [pod("a2", "a-s1", job_id="a-s1", node="n-8")])
    drain(queue)
    sigs = [*router.pod_index("pods").live.values(), *router.pod_index("dispatch-pods").live.values()]
    assert [s[2] for s in sigs] == [(NS, "a-s1", "a-s1", "s1")] * 3
    assert sigs[0][2] is sigs[1][2] is sigs[2][2]
    router.pod_index("pods").on_event("DELETED", pod("a1", "a-s1", job_id="a-s1", node="n-9"))
    assert drain(queue) == {f"{NS}/wl-a"}   # still routed by its group


def test_a_workload_is_filed_under_its_owner_and_identity_as_tuples() -> None:
    """Most owners and identities have one Workload: each index holds a tuple of keys, not a set (an empty
    set alone is 216 bytes), and forgets the entry with its last key."""
    other = workload("wl-b", "a-s1")
    router, _ = router_with(workload("wl-a", "a-s1"), other)
    assert router.by_owner[(NS, "a-s1")] == (f"{NS}/wl-a", f"{NS}/wl-b")
    assert router.by_ident[(NS, "a-s1", "s1")] == (f"{NS}/wl-a", f"{NS}/wl-b")
    router.on_workload("DELETED", workload("wl-a", "a-s1"))
    assert router.by_owner[(NS, "a-s1")] == (f"{NS}/wl-b",)
    router.on_workload("DELETED", other)
    assert router.by_owner == {} and router.by_ident == {}


def test_a_kept_workload_shares_what_other_workloads_have_alike() -> None:
    """10,000 Workloads are kept as slim views: their ref, owner and check entries are slotted (no per-object
    dict), the vocabulary (namespace, owner apiVersion and kind, check name and state, the conditions) is
    one object for all (issue 37: ~4 MiB at 10,000 Workloads)."""
    decoded = [json.loads(json.dumps(workload(name, owner))) for name, owner in (("wl-a", "a-s1"), ("wl-b", "b-s1"))]
    router, _ = router_with(*decoded)   # each string its own object, as the API's answers decode
    a, b = router.workloads[f"{NS}/wl-a"], router.workloads[f"{NS}/wl-b"]
    assert a.owner is not None and b.owner is not None
    for kept in (a.hint.ref, a.owner, a.hint.checks[0]):
        assert not hasattr(kept, "__dict__"), type(kept)
    assert a.owner.kind is b.owner.kind and a.owner.api_version is b.owner.api_version
    assert a.hint.checks[0].name is b.hint.checks[0].name and a.hint.checks[0].state is b.hint.checks[0].state
    assert a.hint.ref.namespace is b.hint.ref.namespace and a.conds is b.conds


def test_a_relist_routes_exactly_the_pods_that_went_or_changed_while_no_watch_ran() -> None:
    router, queue = router_with(workload("wl-a", "a-s1"), workload("wl-b", "b-s1"), workload("wl-c", "c-s1"))
    first = [pod("a0", "a-s1"), pod("b0", "b-s1"), pod("c0", "c-s1")]
    relist(router, "pods", first[:2], first[2:])
    drain(queue)
    relist(router, "pods", first)                       # nothing changed: nothing to re-check
    assert drain(queue) == set()
    relist(router, "pods", [pod("b0", "b-s1", phase="Failed"), pod("c0", "c-s1")])   # a0 went, b0 ended
    assert drain(queue) == {f"{NS}/wl-a", f"{NS}/wl-b"}
    assert set(router.pod_index("pods").live) == {"uid-b0", "uid-c0"}    # the gone pod is forgotten
    assert ("default", "a-s1") in router.last_gone


def test_each_selection_relists_its_own_pods() -> None:
    router, queue = router_with(workload("wl-a", "a-s1"))
    relist(router, "pods", [pod("a0", "a-s1", job_id="a-s1")])
    relist(router, "dispatch-pods", [pod("a0", "a-s1", job_id="a-s1"), pod("a1", "x", job_id="a-s1")])
    drain(queue)
    relist(router, "dispatch-pods", [pod("a0", "a-s1", job_id="a-s1")])   # a1 (only dispatch's labels) went
    assert drain(queue) == {f"{NS}/wl-a"}
    assert set(router.pod_index("pods").live) == {"uid-a0"}


def test_a_workload_relist_requeues_only_changed_workloads_and_drops_the_gone() -> None:
    a, b = workload("wl-a", "a-s1"), workload("wl-b", "b-s1")
    router, queue = router_with(a, b)
    router.list_workloads([a, b])
    assert drain(queue) == set()
    b["status"]["conditions"].append({"type": "Evicted", "status": "True"})
    router.list_workloads([b])
    assert drain(queue) == {f"{NS}/wl-b"}
    assert set(router.workloads) == {f"{NS}/wl-b"} and router.pending == {f"{NS}/wl-b"}


async def test_the_controller_lists_pods_and_workloads_in_small_pages() -> None:
    """Pods and Workloads decode to tens of KiB each and each page is decoded whole: the controller lists them
    100 a page (the two pod selections at once), the other kinds 500 (issue 37: its memory at 100,000 pods)."""
    cluster = FakeCluster()
    kube = k.Kube.connect(namespace=NS, transport=cluster.transport())
    ctl = Controller(kube, Config(namespace=NS, resync_seconds=3600))
    try:
        pages = {name: inf.page_size for name, inf in ctl.informers.items()}
        assert pages["pods"] == pages["dispatch-pods"] == pages["workloads"] == 100
        assert pages["nodes"] == pages["jobsets"] == pages["jobs"] == 500
        await ctl.informers["pods"]._list(False)
        assert [q.get("limit") for m, p, q in cluster.server.requests if m == "GET" and p.endswith("/pods")] == ["100"]
    finally:
        await kube.aclose()


async def test_the_controllers_pod_and_node_lists_reach_the_router_and_the_finalizer_keeper_page_by_page() -> None:
    """Both pod selections and the Node list feed routing and the finalizer keeper from the same pages;
    a Node missing from a later complete list proves the end of the keeper's pods on it only if the keeper
    last saw it Ready=Unknown (issue 40: a Node deleted while Ready has a live kubelet)."""
    cluster = FakeCluster()
    for node in ("node-0", "node-1"):
        cluster.add_node(node)
    for i in range(5):
        obj = pod(f"p{i}", "llama-s1", node=f"node-{i % 2}", job_id="llama")
        obj["metadata"]["finalizers"] = [POD_FINALIZER]
        cluster.server.create("", "pods", NS, obj)
    kube = k.Kube.connect(namespace=NS, transport=cluster.transport())
    ctl = Controller(kube, Config(namespace=NS, resync_seconds=3600))
    try:
        for name in ("pods", "dispatch-pods", "nodes"):
            ctl.informers[name].page_size = 2
            await ctl.informers[name]._list(name == "nodes")
        pages = [q for m, p, q in cluster.server.requests if m == "GET" and p.endswith("/pods")]
        assert len(pages) == 6 and all(q.get("limit") == "2" for q in pages)   # 3 pages per selection
        uids = {str(o["metadata"]["uid"]) for o in cluster.server.objects("", "pods", NS)}   # the server's
        assert len(uids) == 5
        assert set(ctl.router.pod_index("pods").live) == uids == set(ctl.router.pod_index("dispatch-pods").live)
        assert set(ctl.finalizers.signatures) == {f"{NS}/p{i}" for i in range(5)}
        assert ctl.finalizers.on_node_of == {"node-0": {f"{NS}/p0", f"{NS}/p2", f"{NS}/p4"},
                                             "node-1": {f"{NS}/p1", f"{NS}/p3"}}
        assert drain(ctl.finalizers.queue) == set()          # running pods on live Nodes: nothing proven
        assert set(ctl.router.nodes) == {"node-0", "node-1"}
        cluster.server.delete("", "nodes", "", "node-0")
        await ctl.informers["nodes"]._list(True)
        assert drain(ctl.finalizers.queue) == set(), "last seen Ready=True: its kubelet may run on"
        assert set(ctl.router.nodes) == {"node-1"}
        cluster.freeze_node("node-1")                          # the keeper's next list sees it Ready=Unknown
        await ctl.informers["nodes"]._list(True)
        drain(ctl.finalizers.queue)
        cluster.server.delete("", "nodes", "", "node-1")
        await ctl.informers["nodes"]._list(True)
        assert drain(ctl.finalizers.queue) == {f"{NS}/p1", f"{NS}/p3"}
        assert set(ctl.router.nodes) == set()
    finally:
        await kube.aclose()


async def test_a_job_confirming_its_suspension_during_a_first_decision_runs_that_decision_again() -> None:
    """Found on the loaded testbed: a Workload's first decision read its Job before the Job confirmed its
    suspension, and the Job's event arrived before that decision had noted the Workload as waiting; it
    was dropped, and the Workload waited for the 60 s resync. Every pending Workload now hears its Jobs."""
    router, queue = router_with(workload("wl-a", "a-s1"))
    router.queue.add(f"{NS}/wl-a")
    key = await queue.get()                          # a worker holds it: its first decision is in flight
    assert key == f"{NS}/wl-a" and f"{NS}/wl-a" not in router.waiting
    router.on_lower("MODIFIED", {"kind": "Job", "metadata": {"name": "a-s1-node-0", "namespace": NS,
                                                            "labels": {n.JOBSET_NAME_LABEL: "a-s1"}}})
    router.note(key, True, frozenset())             # the decision ends: waiting (on the Job it read)
    queue.done(key)
    assert drain(queue) == {f"{NS}/wl-a"}            # ... and runs once more, seeing the Job's confirmation


async def test_a_node_change_during_a_decision_runs_that_decision_again() -> None:
    router, queue = router_with(workload("wl-a", "a-s1"))
    router.list_nodes([{"metadata": {"name": "node-0"}, "status": {"conditions": [
        {"type": "Ready", "status": "True"}]}}])
    drain(queue)
    router.queue.add(f"{NS}/wl-a")
    key = await queue.get()                          # in flight, having read node-0 as Ready=True
    router.on_node("MODIFIED", {"metadata": {"name": "node-0"}, "status": {"conditions": [
        {"type": "Ready", "status": "Unknown"}]}})
    router.note(key, True, frozenset({"node-0"}))
    queue.done(key)
    assert drain(queue) == {f"{NS}/wl-a"}


def _held(obj: dict[str, Any], *, active: bool = False, quota: bool = True, evicted: bool = False) -> dict[str, Any]:
    """``obj`` as Kueue writes it while held (``spec.active: false``), evicted, or without quota."""
    obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
    obj["spec"]["active"] = active
    obj["status"]["conditions"] = [{"type": "QuotaReserved", "status": "True" if quota else "False"}]
    if evicted:
        obj["status"]["conditions"].append({"type": "Evicted", "status": "True"})
    return obj


def test_a_held_workload_is_decided_once_as_it_goes_out_of_screening_and_again_as_it_comes_back() -> None:
    """Issue 37: a held or evicted Workload's decision reads it and writes nothing, yet every pod, Job and Kueue
    write while it stayed so queued one (~7 a round of hold and release on the testbed, in flight when the
    decisive event came). Now: one decision as it leaves screening (it settles what the controller noted), none
    while it stays out, one as soon as a change brings it back, and every change below it after that."""
    wl = workload("wl-a", "a-s1")
    router, queue = router_with(wl)
    key = f"{NS}/wl-a"
    router.on_workload("MODIFIED", _held(wl, evicted=True))
    assert drain(queue) == {key}                     # it went out of screening: decided once
    router.on_workload("MODIFIED", _held(wl, quota=False))
    router.on_workload("MODIFIED", _held(wl, quota=False, active=False))
    index = router.pod_index("pods")
    index.on_event("ADDED", pod("a0", "a-s1"))
    index.on_event("MODIFIED", pod("a0", "a-s1", phase="Failed"))
    router.on_lower("MODIFIED", {"kind": "Job", "metadata": {"name": "a-s1-node-0", "namespace": NS,
                                                            "labels": {n.JOBSET_NAME_LABEL: "a-s1"}}})
    assert drain(queue) == set()                     # held: Kueue's writes and the pod's and Job's changes
    assert ("default", "a-s1") in router.last_gone   # ... still time the pod's end
    router.on_workload("MODIFIED", _held(wl, quota=False, active=True))
    assert drain(queue) == set()                     # released, not yet reserved: still screened out
    router.on_workload("MODIFIED", _held(wl, quota=True, active=True))
    assert drain(queue) == {key}                     # reserved again: decided
    index.on_event("DELETED", pod("a0", "a-s1", phase="Failed"))
    router.on_lower("DELETED", {"kind": "Job", "metadata": {"name": "a-s1-node-0", "namespace": NS,
                                                           "labels": {n.JOBSET_NAME_LABEL: "a-s1"}}})
    assert drain(queue) == {key}
    router.requeue_all()                             # the resync and a new leader queue every pending one
    router.on_workload("MODIFIED", _held(wl, active=False))
    assert drain(queue) == {key}


def test_a_workload_first_seen_screened_out_is_decided_when_it_gets_quota() -> None:
    wl = _held(workload("wl-a", "a-s1"), quota=False, active=True)
    router, queue = router_with()
    router.on_workload("ADDED", wl)
    assert drain(queue) == set()
    router.on_workload("MODIFIED", _held(wl, quota=True, active=True))
    assert drain(queue) == {f"{NS}/wl-a"}


def test_a_pods_end_is_timed_when_it_is_first_seen_not_to_run_not_at_its_deletion() -> None:
    """``dispatch_pod_gone_to_ready_seconds`` and the "admitted" line's ``gone_to_decision_ms`` start at the
    pod's end: a decision may admit on the pod's terminal status, before the pod object is deleted."""
    router, _queue = router_with(workload("wl-a", "a-s1"))
    index = router.pod_index("pods")
    index.on_event("ADDED", pod("a0", "a-s1"))
    assert ("default", "a-s1") not in router.last_gone
    index.on_event("MODIFIED", pod("a0", "a-s1", phase="Failed"))
    ended = router.last_gone[("default", "a-s1")]
    index.on_event("DELETED", pod("a0", "a-s1", phase="Failed"))
    assert router.last_gone[("default", "a-s1")] == ended
    index.on_event("ADDED", pod("a1", "a-s1"))
    index.on_event("DELETED", pod("a1", "a-s1"))     # deleted while it could run: its end is its deletion
    assert router.last_gone[("default", "a-s1")] > ended


def test_a_wait_a_relist_shows_screened_out_is_not_left_counted() -> None:
    """A decision the cache did not queue (the resync, a JobSet relist, a retry) read the Workload released and
    reserved while the Workload watch was down, and noted it waiting on a pod; it was held again before the watch
    relisted. The relist shows it held as the cache last saw it: "was and stays screened out", though it was not
    in between. It was left counted in ``dispatch_workloads_waiting`` (``longest_wait`` growing) until the
    resync, as its pods' events no longer queue it: now a wait is noted only while the cache shows it decidable."""
    wl = _held(workload("wl-a", "a-s1"), quota=False)
    router, queue = router_with(wl)
    key = f"{NS}/wl-a"
    index = router.pod_index("pods")
    index.on_event("ADDED", pod("a0", "a-s1"))
    drain(queue)
    router.note(key, True, frozenset({"node-0"}))     # the ungated decision: waits on a0
    router.list_workloads([_held(wl, quota=False)])   # the relist: held, as before
    index.on_event("DELETED", pod("a0", "a-s1"))
    assert key not in router.waiting or drain(queue) == {key}


async def test_a_wait_noted_after_a_relist_showed_it_screened_out_is_not_left_counted() -> None:
    """As above, but the relist lands while that decision is in flight: it notes the Workload waiting after."""
    wl = _held(workload("wl-a", "a-s1"), quota=False)
    router, queue = router_with(wl)
    key = f"{NS}/wl-a"
    index = router.pod_index("pods")
    index.on_event("ADDED", pod("a0", "a-s1"))
    router.requeue_all()                              # the resync
    assert await queue.get() == key                   # in flight: reads it released and reserved
    router.list_workloads([_held(wl, quota=False)])   # the relist: held again, as the cache last saw it
    router.note(key, True, frozenset({"node-0"}))     # ... waiting on a0
    queue.done(key)
    index.on_event("DELETED", pod("a0", "a-s1"))
    assert key not in router.waiting or drain(queue) == {key}


async def test_a_workload_deleted_while_its_decision_is_in_flight_is_not_left_counted_waiting() -> None:
    """Its decision read it before the deletion and ends waiting (on its JobSet: no Node): it was counted waiting
    for good, no longer pending for the resync to queue, and the longest wait (alerted on at 30 min) grew."""
    router, queue = router_with(workload("wl-a", "a-s1"))
    key = f"{NS}/wl-a"
    router.queue.add(key)
    assert await queue.get() == key
    router.on_workload("DELETED", workload("wl-a", "a-s1"))
    router.note(key, True, frozenset())
    queue.done(key)
    router.requeue_all()
    assert key not in router.waiting or drain(queue) == {key}


def test_a_pod_that_ended_while_no_watch_ran_is_timed_by_the_relist() -> None:
    """A pod seen running, then ended (kubelet-confirmed) while the pod watch was down: the relist is the first
    sight of its end, so it times it (``last_gone``); its deletion after is not timed again. Before, its
    deletion timed it; now neither did, and ``gone_to_decision_ms`` counted from an older pod's end."""
    router, queue = router_with(workload("wl-a", "a-s1"))
    relist(router, "pods", [pod("a0", "a-s1")])
    assert ("default", "a-s1") not in router.last_gone
    relist(router, "pods", [pod("a0", "a-s1", phase="Failed")])
    assert drain(queue) == {f"{NS}/wl-a"}
    ended = router.last_gone[("default", "a-s1")]
    router.pod_index("pods").on_event("DELETED", pod("a0", "a-s1", phase="Failed"))
    assert router.last_gone[("default", "a-s1")] == ended


async def test_a_wait_the_cache_lags_behind_is_noted_by_the_decision_its_catching_up_queues() -> None:
    """The other side of noting only what the cache shows decidable: a decision that read the Workload reserved
    before the cache did is not counted, and the Workload's event, when it comes, queues the decision that is."""
    wl = _held(workload("wl-a", "a-s1"), quota=False, active=True)
    router, queue = router_with(wl)
    key = f"{NS}/wl-a"
    router.requeue_all()
    assert await queue.get() == key                   # reads it reserved; the cache still shows it without quota
    router.note(key, True, frozenset({"node-0"}))
    queue.done(key)
    assert key not in router.waiting and drain(queue) == set()
    router.on_workload("MODIFIED", _held(wl, quota=True, active=True))
    assert drain(queue) == {key}
    router.note(key, True, frozenset({"node-0"}))
    assert key in router.waiting and router.node_waiters == {"node-0": {key}}


def test_a_relist_that_skipped_an_eviction_and_a_new_reservation_queues_the_workload() -> None:
    """The Workload watch was down while Kueue evicted a Workload past screening (its decision then read it
    evicted: ``not_now``) and reserved quota again: Kueue leaves a Pending check's message as it was, so the
    relist shows the signature the cache last saw, and nothing but the resync decided it, though it could be
    admitted (the pods it waited on went during the eviction, their events spent on that decision)."""
    wl = workload("wl-a", "a-s1")
    router, queue = router_with(wl)
    key = f"{NS}/wl-a"
    index = router.pod_index("pods")
    index.on_event("ADDED", pod("a0", "a-s1"))
    drain(queue)
    index.on_event("DELETED", pod("a0", "a-s1"))     # its decision reads the Workload evicted
    assert drain(queue) == {key}
    wl["metadata"]["resourceVersion"] = "9"          # evicted, then reserved again: as the cache last saw it
    router.list_workloads([wl])
    assert drain(queue) == {key}
