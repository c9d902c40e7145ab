"""Trainer's status step and Kueue's finished Workload, the fake held to the real ones (issue 34).

A campaign's stall: an object closed and opened again under its name had its new Workload declared finished by
Kueue at once, and Kueue never admitted it. Trainer v2.3 copies the ``Completed`` and ``Failed`` conditions of
the JobSet *of the TrainJob's name* into the TrainJob (``JobSet.Status``: no owner check), with that JobSet's own
reason, message and ``lastTransitionTime``; Kueue v0.19.2 then finishes the TrainJob's Workload. An earlier
TrainJob's finished JobSet that the garbage collector left so makes a new TrainJob look Succeeded or Failed before
it ran. Here a finished JobSet is made on purpose (its status written by the operator, dated ten minutes back),
and a Kueue-managed TrainJob of its name is created: it reports the JobSet's end, its Workload is finished, and
dispatch's status calls the end not its own.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dispatch import _decision as d
from dispatch import _names as n
from dispatch._trainer import TrainJobView, labels_entry
from dispatch._views import JobSetView
from dispatch.controller.testing import FakeKueue
from dispatch.testing import FakeCluster

Obj = dict[str, Any]
ENDS = {"tjc": ("Completed", "Complete", "AllJobsCompleted", "jobset completed successfully", "Succeeded"),
        "tjf": ("Failed", "Failed", "FailedJobs", "jobset failed due to one or more job failures", "Failed")}
"""name -> the JobSet's condition, the TrainJob's, JobSet v0.12's reason and message, the Workload's reason."""


def finished_jobset(name: str) -> Obj:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
            "spec": {"suspend": True, "replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {
                "parallelism": 1, "completions": 1, "template": {"spec": {
                    "restartPolicy": "Never", "containers": [{"name": "c", "image": "example.invalid/train"}]}}}}}]}}


def ended(name: str, when: str) -> Obj:
    theirs, _, reason, message, _ = ENDS[name]
    return {"status": {"conditions": [{"type": theirs, "status": "True", "reason": reason, "message": message,
                                       "lastTransitionTime": when}]}}


def trainjob(name: str, queue: str) -> Obj:
    """A TrainJob of the name under Kueue as dispatch opens one (its identity labels and runtime patch entry), never
    admitted (no A)."""
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "labels": {n.KUEUE_QUEUE_LABEL: queue, n.LABEL_JOB_ID: name,
                                                  n.LABEL_SUBMISSION: "s1"}},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 1},
                     "runtimePatches": [labels_entry(n.PATCH_MANAGER, {"node": {}})]}}


def condition(obj: Obj, ctype: str) -> Obj | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c.get("type") == ctype and c.get("status") == "True"), None)


def story(make_jobset: Callable[[str, str], Obj], make_trainjob: Callable[[str], Obj],
          get: Callable[[str, str], Obj | None], workloads: Callable[[], list[Obj]],
          until: Callable[[str, Callable[[], bool]], None], now: datetime) -> dict[str, str]:
    """``now``: the API server's clock (the fake's runs from its own start)."""
    when = (now - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    jobsets = {name: make_jobset(name, when) for name in ENDS}
    outcomes: dict[str, str] = {}
    made = {name: make_trainjob(name) for name in ENDS}
    for name, (_, ours, reason, message, wl_reason) in ENDS.items():
        def reported(name: str = name, ours: str = ours) -> bool:
            return condition(get("trainjobs", name) or {}, ours) is not None
        until(f"trainjob {name} reporting {ours}", reported)
        tj = get("trainjobs", name)
        assert tj is not None
        got = condition(tj, ours)
        assert got is not None
        assert (got["reason"], got["message"], got["lastTransitionTime"]) == (reason, message, when), got
        assert tj["spec"].get("suspend") is True, "it never ran"

        # Kueue finishes the Workload it made before the end was copied; if Trainer copied it first, Kueue makes
        # none (a job that reports finished gets no Workload, Kueue's reconciler step 3): either way it never
        # admits this TrainJob. Which one is a race between the two controllers (both seen on the testbed).
        def mine(uid: str = made[name]["metadata"]["uid"]) -> list[Obj]:
            return [w for w in workloads() if (w["metadata"].get("labels") or {}).get(n.KUEUE_JOB_UID_LABEL) == uid]

        def settled(wl_reason: str = wl_reason) -> bool:
            return all((condition(w, "Finished") or {}).get("reason") == wl_reason for w in mine())
        until(f"trainjob {name}'s Workload Finished ({wl_reason}), if Kueue made one", settled)
        outcomes[name] = "finished" if mine() else "none"
        for w in mine():
            assert condition(w, "Admitted") is None or condition(w, "Finished") is not None
        # dispatch: an end on a TrainJob never admitted is not its own (the JobSet has no owner to name); the
        # condition's date is the JobSet's, before the TrainJob's creation
        view = TrainJobView.from_obj(tj)
        assert view.ended_at is not None and view.created is not None and view.ended_at < view.created
        text = d.copied_end_text(view, JobSetView.from_obj(jobsets[name]))
        assert text is not None and d.COPIED_END in text and "carries no A" in text, text
        assert f"`dispatch close {name}`" in text
    print(f"Kueue's Workload of each: {outcomes}")
    return outcomes


@pytest.mark.parametrize("kueue_first", [True, False], ids=["kueue-first", "trainer-first"])
def test_the_fakes_trainer_copies_a_namesake_jobsets_end_and_kueue_finishes_the_workload(kueue_first: bool) -> None:
    cluster = FakeCluster()
    cluster.add_runtime()
    kueue = FakeKueue(cluster)
    kueue.install()
    srv = cluster.server

    def make_jobset(name: str, when: str) -> Obj:
        srv.create("jobset.x-k8s.io", "jobsets", "default", finished_jobset(name))
        srv.update("jobset.x-k8s.io", "jobsets", "default", name,
                   lambda obj: obj.setdefault("status", {}).update(ended(name, when)["status"]), status=True)
        got = srv.get("jobset.x-k8s.io", "jobsets", "default", name)
        assert got is not None
        return got

    def until(what: str, cond: Callable[[], bool]) -> None:
        for _ in range(5):
            if kueue_first:
                kueue.reconcile_jobs()
            cluster.trainer_sync()
            cluster.jobset_sync()
            kueue.reconcile_jobs()
            kueue.sync()
            if cond():
                return
        raise AssertionError(f"the fake never showed {what}")

    def make_trainjob(name: str) -> Obj:
        body = trainjob(name, kueue.queue)
        body["spec"]["suspend"] = True    # as Kueue's defaulting webhook makes a TrainJob with a queue-name label
        return srv.create("trainer.kubeflow.org", "trainjobs", "default", body)

    outcomes = story(make_jobset, make_trainjob,
          lambda plural, name: srv.get("trainer.kubeflow.org" if plural == "trainjobs" else "", plural, "default",
                                       name),
          lambda: list(srv.objects("kueue.x-k8s.io", "workloads", "default")), until, srv.clock())
    assert set(outcomes.values()) == {"finished" if kueue_first else "none"}


@pytest.mark.testbed
def test_the_real_trainer_copies_a_namesake_jobsets_end_and_kueue_finishes_the_workload(
        testbed_kubeconfig: str) -> None:
    from dispatch import testbed

    ns = f"trainerctl-{uuid.uuid4().hex[:6]}"
    testbed.kubectl("create", "namespace", ns)
    testbed.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq"},
        "spec": {"clusterQueue": "cq"}}))

    def get(plural: str, name: str) -> Obj | None:
        got = testbed.kubectl("get", plural, name, "-n", ns, "-o", "json", check=False)
        return json.loads(got.stdout) if got.returncode == 0 else None

    def make_jobset(name: str, when: str) -> Obj:
        testbed.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(finished_jobset(name)))
        testbed.kubectl("patch", "jobset", name, "-n", ns, "--subresource=status", "--type=merge",
                        "-p", json.dumps(ended(name, when)))
        got = get("jobsets", name)
        assert got is not None
        return got

    def until(what: str, cond: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 90
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"the real control plane never showed {what}")
            time.sleep(0.5)

    try:
        story(make_jobset,
              lambda name: json.loads(testbed.kubectl("create", "-n", ns, "-o", "json", "-f", "-",
                                                      input=json.dumps(trainjob(name, "lq"))).stdout),
              get, lambda: list(json.loads(testbed.kubectl("get", "workloads", "-n", ns, "-o", "json").stdout)
                                ["items"]), until, datetime.now(UTC))
    finally:
        testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)
