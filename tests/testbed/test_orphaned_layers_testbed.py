"""The two stalls of the two-hour campaign (issue 34), made on purpose on the real control plane: an object closed
and opened again under its name while kube-controller-manager (its garbage collector and Job controller) is
stopped, so what the collector would remove stays, as it stayed after the campaign's API server restarts.

* ``p1``: the earlier JobSet is gone but its Job is not. JobSet (its own process, running) never adopts that Job
  and cannot create the new JobSet's Job of the same name (``JobCreationFailed``): A=2 is admitted (nothing of
  A=1 may run) and never starts. ``status`` names the Job and its delete.
* ``p0``: the earlier JobSet and Job are gone but Trainer's runtime snapshot ConfigMap is not. Trainer builds
  nothing and says so only in a Warning Event. ``status`` reads it and names the ConfigMap and its delete.

The operator does what status names, kube-controller-manager starts again, and A=2 runs. The library holds
exactly the shipped ``dispatch-writer`` and ``dispatch-node-reader`` roles; the operator is the testbed's admin.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch import LABEL_ADMISSION, Adapter, JobSpec
from dispatch import _decision as d
from dispatch import testbed as tb
from dispatch.testbed.harness import apply_shipped_roles, keeper_pass, role_kubeconfig_file

pytestmark = pytest.mark.testbed
Obj = dict[str, Any]
KCM = "kube-controller-manager"


@pytest.fixture
def ns(testbed_kubeconfig: str) -> Iterator[str]:
    apply_shipped_roles()
    name = f"orphan-{uuid.uuid4().hex[:6]}"
    tb.kubectl("create", "namespace", name)
    yield name
    tb.kubectl("delete", "namespace", name, "--wait=false", check=False)


def until(what: str, cond: Callable[[], Any], timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"the real control plane never showed {what}")
        time.sleep(0.5)


def get(ns: str, *args: str) -> Obj | None:
    got = tb.kubectl("get", *args, "-n", ns, "-o", "json", check=False)
    return json.loads(got.stdout) if got.returncode == 0 else None


def pods(ns: str, name: str) -> list[Obj]:
    listed = get(ns, "pods", "-l", f"jobset.sigs.k8s.io/jobset-name={name}") or {"items": []}
    return list(listed["items"])


def first_run_held_then_closed_with_the_collector_stopped(a: Adapter, ns: str, spec: JobSpec) -> str:
    """A=1 runs, is held (its pods go) and closed while kube-controller-manager is stopped. Returns the name."""
    name = a.open(spec).name
    assert a.release(name).admission == 1
    until("A=1's pods Running", lambda: pods(ns, name) and all(
        p["status"].get("phase") == "Running" for p in pods(ns, name)))
    a.hold(name)

    def gone() -> bool:   # the controller's keeper frees each pod dispatch's finalizer holds (no controller runs)
        keeper_pass(ns)
        return not pods(ns, name)
    until("A=1's pods gone", gone, 120)
    tb.stop_component(KCM)
    a.close(name)
    until("the TrainJob gone", lambda: get(ns, "trainjob", name) is None)
    return name


def test_an_earlier_jobsets_job_left_behind_is_named_and_its_delete_lets_the_next_execution_run(
        ns: str, tmp_path: Path) -> None:
    spec = JobSpec(job_id="orph", submission="s1", num_nodes=1)
    with role_kubeconfig_file(ns, tmp_path) as writer, Adapter.connect(ns, kubeconfig=str(writer)) as a:
        try:
            name = first_run_held_then_closed_with_the_collector_stopped(a, ns, spec)
            old_jobs = (get(ns, "jobs", "-l", f"jobset.sigs.k8s.io/jobset-name={name}") or {"items": []})["items"]
            assert len(old_jobs) == 1, old_jobs
            job = old_jobs[0]["metadata"]["name"]
            # the collector took the JobSet and the snapshot, not the Job (done here by the admin); Trainer
            # before v2.3 keeps no snapshot, hence --ignore-not-found
            tb.kubectl("delete", f"jobset/{name}", f"configmap/{name}-runtime-snapshot", "-n", ns, "--wait=false",
                       "--ignore-not-found")
            until("the old JobSet gone", lambda: get(ns, "jobset", name) is None)
            a.open(spec)
            assert a.release(name).admission == 2
            new = until("the new JobSet", lambda: get(ns, "jobset", name))
            uid = new["metadata"]["uid"]
            events = until("JobSet's JobCreationFailed", lambda: (get(
                ns, "events", "--field-selector", f"involvedObject.uid={uid},reason=JobCreationFailed")
                or {"items": []})["items"])
            print(f"JobSet said: {events[0]['message']}")
            detail = until("status naming the Job", lambda: (lambda t: t if d.ORPHANED_JOB in t else None)(
                a.inspect(name).cause.detail))
            print(f"status said: {detail}")
            assert f"job {job} {d.ORPHANED_JOB} of this name" in detail, detail
            assert f"`kubectl delete job/{job}`" in detail, detail
            assert pods(ns, name) == []
            tb.kubectl("delete", "job", job, "-n", ns, "--wait=false")   # as status says
        finally:
            tb.start_component(KCM)
        running = until("A=2's pod Running", lambda: [p for p in pods(ns, name) if p["status"].get("phase")
                                                       == "Running"], 180)
        assert {p["metadata"]["labels"][LABEL_ADMISSION] for p in running} == {"2"}
        assert d.ORPHANED_JOB not in a.inspect(name).cause.detail


def test_an_earlier_trainjobs_snapshot_left_behind_is_named_and_its_delete_lets_trainer_build(
        ns: str, tmp_path: Path) -> None:
    spec = JobSpec(job_id="orph", submission="s2", num_nodes=1)
    with role_kubeconfig_file(ns, tmp_path) as writer, Adapter.connect(ns, kubeconfig=str(writer)) as a:
        try:
            name = first_run_held_then_closed_with_the_collector_stopped(a, ns, spec)
            if get(ns, f"configmap/{name}-runtime-snapshot") is None:
                pytest.skip("this stack's Trainer keeps no runtime snapshot (v2.3 and later do)")
            # the collector took the JobSet and its Job, not the snapshot (done here by the admin)
            tb.kubectl("delete", "jobset", name, "-n", ns, "--wait=false")
            tb.kubectl("delete", "jobs", "-l", f"jobset.sigs.k8s.io/jobset-name={name}", "-n", ns, "--wait=false")
            until("the old JobSet gone", lambda: get(ns, "jobset", name) is None)
            a.open(spec)
            held = until("status naming the snapshot", lambda: (lambda t: t if d.SNAPSHOT_OWNED in t else None)(
                a.inspect(name).cause.detail))
            print(f"status said (held): {held}")
            assert f"configmap {name}-runtime-snapshot {d.ORPHANED}" in held, held
            assert a.release(name).admission == 2
            detail = a.inspect(name).cause.detail
            print(f"status said (running): {detail}")
            assert f"Trainer has built no JobSet for trainjob {name}" in detail, detail
            assert f"configmap/{name}-runtime-snapshot" in detail, detail
            assert get(ns, "jobset", name) is None
            tb.kubectl("delete", f"configmap/{name}-runtime-snapshot", "-n", ns, "--wait=false")   # as named
        finally:
            tb.start_component(KCM)
        running = until("A=2's pod Running", lambda: [p for p in pods(ns, name) if p["status"].get("phase")
                                                       == "Running"], 240)
        assert {p["metadata"]["labels"][LABEL_ADMISSION] for p in running} == {"2"}
        assert "Trainer has built no JobSet" not in a.inspect(name).cause.detail
