"""The fake's JobSet and the API server's Event field selectors held to the real ones (issue 34).

The two-hour campaign's stall: a re-opened object's new JobSet never made its Job, because the earlier JobSet's Job
of that name was still there (the garbage collector had missed it). JobSet names a child Job after itself and finds
its own Jobs by their controller owner's uid (v0.11, v0.12), so it never adopts a Job it does not control: its
create is refused (AlreadyExists) and it records a Warning Event ``JobCreationFailed``. The fake once took such a
Job over by its name (and resumed it). ``status`` finds what Trainer and JobSet report only in Events by a field
selector (``involvedObject.uid``, ``reason``), which the fake's list now serves as the real one does.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from dispatch.testing import FakeCluster
from dispatch.testing._server import ApiFailure

Obj = dict[str, Any]
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


def left_job(name: str) -> Obj:
    """The Job an earlier JobSet ``name`` left: JobSet's name for its replicatedJob ``node``, index 0, suspended,
    with no owner (orphaned)."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"{name}-node-0", "labels": {JOBSET_NAME_LABEL: name}},
            "spec": {"suspend": True, "parallelism": 1, "completions": 1, "completionMode": "Indexed",
                     "template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "c", "image": "example.invalid/train"}]}}}}


def jobset(name: str) -> Obj:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
            "spec": {"suspend": True, "replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {
                "parallelism": 1, "completions": 1, "template": {"spec": {
                    "restartPolicy": "Never", "containers": [{"name": "c", "image": "example.invalid/train"}]}}}}}]}}


def story(create: Callable[[Obj], Obj], jobs: Callable[[], list[Obj]], events: Callable[[str], list[Obj]],
          until: Callable[[str, Callable[[], bool]], None]) -> str:
    """The Job first, then a JobSet of the name: the JobSet reports it cannot create its Job, and the Job stays
    another's. Returns the Event's message."""
    old = create(left_job("js"))
    made = create(jobset("js"))
    uid = made["metadata"]["uid"]
    found: list[Obj] = []

    def failed() -> bool:
        found[:] = events(f"involvedObject.uid={uid},reason=JobCreationFailed")
        return bool(found)
    until("JobSet's JobCreationFailed Event", failed)
    [job] = jobs()
    assert job["metadata"]["uid"] == old["metadata"]["uid"]
    assert not any(o.get("uid") == uid for o in job["metadata"].get("ownerReferences") or []), "adopted"
    assert job["spec"]["suspend"] is True
    assert found[0]["type"] == "Warning" and found[0]["involvedObject"]["name"] == "js"
    assert events(f"involvedObject.uid={uuid.uuid4()},reason=JobCreationFailed") == []
    message = str(found[0]["message"])
    assert 'jobs.batch "js-node-0" already exists' in message, message
    return message


def test_the_fakes_jobset_never_adopts_a_job_of_its_name() -> None:
    cluster = FakeCluster()
    srv = cluster.server

    def until(what: str, cond: Callable[[], bool]) -> None:
        for _ in range(5):
            cluster.jobset_sync()
            if cond():
                return
        raise AssertionError(f"the fake never showed {what}")

    def events(fields: str) -> list[Obj]:
        return list(srv.list(srv.kind("", "events"), "default", {"fieldSelector": fields})["items"])

    story(create=lambda obj: srv.create(obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else "",
                                        "jobs" if obj["kind"] == "Job" else "jobsets", "default", obj),
          jobs=lambda: srv.objects("batch", "jobs", "default"), events=events, until=until)
    with pytest.raises(ApiFailure, match=r"field label not supported: spec\.foo"):
        events("spec.foo=x")


@pytest.mark.testbed
def test_the_real_jobset_never_adopts_a_job_of_its_name(testbed_kubeconfig: str) -> None:
    from dispatch import testbed

    ns = f"jobsetctl-{uuid.uuid4().hex[:6]}"
    testbed.kubectl("create", "namespace", ns)

    def until(what: str, cond: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 60
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"the real control plane never showed {what}")
            time.sleep(0.5)

    def events(fields: str) -> list[Obj]:
        return list(json.loads(testbed.kubectl("get", "events", "-n", ns, "--field-selector", fields,
                                               "-o", "json").stdout)["items"])

    try:
        message = story(create=lambda obj: json.loads(testbed.kubectl("create", "-n", ns, "-o", "json", "-f", "-",
                                                                      input=json.dumps(obj)).stdout),
                        jobs=lambda: list(json.loads(testbed.kubectl("get", "jobs", "-n", ns, "-o", "json")
                                                     .stdout)["items"]),
                        events=events, until=until)
        print(f"JobSet said: {message}")
        refused = testbed.kubectl("get", "events", "-n", ns, "--field-selector", "spec.foo=x", check=False)
        assert refused.returncode != 0 and "field label not supported: spec.foo" in refused.stderr, refused.stderr
    finally:
        testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)
