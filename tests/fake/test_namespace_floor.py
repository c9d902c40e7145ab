"""A namespace deleted and re-created never makes a submission count from 1 again (issue 25, item 6).

Records are namespaced and go with their namespace; each submission's cluster-scoped floor does not, and a
record created again continues from it. Only ``admin forget`` (dispatch-admin) deletes a floor. Every
client here holds exactly the shipped roles, bound as the docs say (the writer per namespace).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dispatch import Adapter, DispatchError, Forbidden, JobSpec, Refused
from dispatch import _names as n
from dispatch._api import SUBMISSION_FLOORS
from dispatch._identity import ADMISSION_LIMIT, floor_name, new_floor, record_name
from dispatch.controller.testing import keeper_pass
from dispatch.testing import Binding, FakeCluster

NS = "team"
WRITER = (Binding("dispatch-writer", NS), "dispatch-node-reader")
ADMIN = ("dispatch-admin", "dispatch-node-reader")
SPEC = JobSpec(job_id="llama", submission="s1")
FLOOR = floor_name(NS, "llama", "s1")


def make_namespace(cluster: FakeCluster) -> None:
    cluster.server.create("", "namespaces", "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})


def delete_namespace(cluster: FakeCluster) -> None:
    """The namespace controller's work, with the controller's finalizer keeper freeing the pods it proves."""
    for _ in range(30):
        if cluster.server.delete_namespace(NS) == 0:
            break
        keeper_pass(cluster, NS, settle=False)
        cluster.settle()
        cluster.advance(60)
    assert cluster.server.delete_namespace(NS) == 0
    assert cluster.server.get("", "namespaces", "", NS) is None
    assert cluster.server.get(n.DOMAIN, "submissionrecords", NS, record_name("llama", "s1")) is None


def run_and_close(adapter: Adapter, cluster: FakeCluster, spec: JobSpec) -> int:
    status = adapter.open(spec, hold=False)
    adapter.close(status.name)
    cluster.settle()
    cluster.advance(60)
    cluster.settle()
    return status.identity.admission


@pytest.fixture
def team(cluster: FakeCluster) -> Iterator[Adapter]:
    make_namespace(cluster)
    with Adapter.connect(NS, transport=cluster.transport(roles=WRITER)) as a:
        yield a


def floor_a(cluster: FakeCluster) -> int | None:
    obj = cluster.server.get(n.DOMAIN, "submissionfloors", "", FLOOR)
    return None if obj is None else int(obj["spec"]["admission"])


def test_a_namespace_deleted_and_recreated_does_not_make_a_submission_count_from_one_again(
    team: Adapter, cluster: FakeCluster
) -> None:
    assert run_and_close(team, cluster, SPEC) == 1
    assert run_and_close(team, cluster, JobSpec(job_id="llama", submission="s1", name="again")) == 2
    assert floor_a(cluster) == 2
    delete_namespace(cluster)
    assert floor_a(cluster) == 2          # cluster-scoped: the namespace's deletion leaves it
    make_namespace(cluster)
    with Adapter.connect(NS, transport=cluster.transport(roles=WRITER)) as again:
        assert again.open(SPEC, hold=False).identity.admission == 3
    assert floor_a(cluster) == 3
    cluster.history.check()


def test_a_held_object_deleted_with_its_namespace_never_reuses_the_a_it_was_issued(
    team: Adapter, cluster: FakeCluster
) -> None:
    """Not closed: the namespace goes while the object holds the submission; its A was issued all the same."""
    assert team.open(SPEC, hold=False).identity.admission == 1
    delete_namespace(cluster)
    make_namespace(cluster)
    with Adapter.connect(NS, transport=cluster.transport(roles=WRITER)) as again:
        assert again.open(SPEC, hold=False).identity.admission == 2
    cluster.history.check()


def test_only_admin_forget_makes_a_submission_of_a_deleted_namespace_count_from_one(
    team: Adapter, cluster: FakeCluster
) -> None:
    run_and_close(team, cluster, SPEC)
    delete_namespace(cluster)
    make_namespace(cluster)
    with Adapter.connect(NS, transport=cluster.transport(roles=ADMIN)) as admin:
        assert admin.forget("llama", "s1") is True      # no record any more: the floor is what it forgets
        assert floor_a(cluster) is None
        assert admin.forget("llama", "s1") is False
    with Adapter.connect(NS, transport=cluster.transport(roles=WRITER)) as again:
        assert again.open(SPEC, hold=False).identity.admission == 1


def test_admin_forget_deletes_the_floor_with_the_record(team: Adapter, cluster: FakeCluster) -> None:
    run_and_close(team, cluster, SPEC)
    with Adapter.connect(NS, transport=cluster.transport(roles=ADMIN)) as admin:
        assert admin.forget("llama", "s1") is True
    assert floor_a(cluster) is None
    assert team.open(SPEC, hold=False).identity.admission == 1


def test_no_writer_can_delete_or_lower_a_floor(team: Adapter, cluster: FakeCluster) -> None:
    """The floor's rules hold for every holder of the shipped writer roles, not only for dispatch's code."""
    run_and_close(team, cluster, JobSpec(job_id="llama", submission="s1"))
    run_and_close(team, cluster, JobSpec(job_id="llama", submission="s1", name="again"))
    kube = team._async.core.kube
    with pytest.raises(Forbidden):
        team._run(kube.delete(SUBMISSION_FLOORS, FLOOR))
    with pytest.raises(DispatchError, match="A never decreases"):
        team._run(kube.merge_patch(SUBMISSION_FLOORS, FLOOR, {"spec": {"admission": 1}}))
    with pytest.raises(DispatchError, match="never changes"):
        team._run(kube.merge_patch(SUBMISSION_FLOORS, FLOOR, {"spec": {"namespace": "other"}}))
    assert floor_a(cluster) == 2


def test_a_record_lost_with_its_namespace_is_made_again_from_the_floor_at_release(
    team: Adapter, cluster: FakeCluster
) -> None:
    """An object opened in the re-created namespace whose record is gone before its first release: the
    release continues from the floor, never from 1."""
    run_and_close(team, cluster, SPEC)
    run_and_close(team, cluster, JobSpec(job_id="llama", submission="s1", name="again"))
    delete_namespace(cluster)
    make_namespace(cluster)
    with Adapter.connect(NS, transport=cluster.transport(roles=WRITER)) as again:
        again.open(SPEC)                                   # held: no A yet
        cluster.server.delete(n.DOMAIN, "submissionrecords", NS, record_name("llama", "s1"))
        assert again.release("llama-s1").admission == 3
    assert floor_a(cluster) == 3
    cluster.history.check()


def test_a_floor_that_names_another_submission_is_refused_never_read_as_0(team: Adapter, cluster: FakeCluster
                                                                          ) -> None:
    cluster.server.create(n.DOMAIN, "submissionfloors", "", {
        "apiVersion": SUBMISSION_FLOORS.api_version, "kind": SUBMISSION_FLOORS.kind, "metadata": {"name": FLOOR},
        "spec": {"namespace": NS, "jobId": "other", "submission": "s9", "admission": 7}})
    with pytest.raises(Refused, match=f"submissionfloors/{FLOOR} names 'team'/'other'/'s9'") as got:
        team.open(SPEC)
    assert got.value.reason == "RecordInvalid"
    assert cluster.server.get(n.DOMAIN, "submissionrecords", NS, record_name("llama", "s1")) is None


def test_a_record_made_below_the_floor_never_issues_a_number_under_it(team: Adapter, cluster: FakeCluster) -> None:
    """A record re-created by hand (or restored) below what the floor remembers: release refuses, naming the
    floor, rather than issue an A that ran in the namespace's earlier life; close and re-open goes on above."""
    run_and_close(team, cluster, SPEC)
    run_and_close(team, cluster, JobSpec(job_id="llama", submission="s1", name="again"))
    delete_namespace(cluster)
    make_namespace(cluster)
    with Adapter.connect(NS, transport=cluster.transport(roles=WRITER)) as again:
        again.open(SPEC)
        name = record_name("llama", "s1")
        cluster.server.delete(n.DOMAIN, "submissionrecords", NS, name)
        obj = cluster.server.create(n.DOMAIN, "submissionrecords", NS, {
            "apiVersion": "dispatch.phpboyscout.uk/v1alpha1", "kind": "SubmissionRecord",
            "metadata": {"name": name, "labels": {n.LABEL_JOB_ID: "llama", n.LABEL_SUBMISSION: "s1",
                                                  "dispatch.phpboyscout.uk/trainjob": "llama-s1"}},
            "spec": {"jobId": "llama", "submission": "s1", "admission": 0, "token": "",
                     "trainJob": {"name": "llama-s1", "uid": ""}}})
        assert obj["spec"]["admission"] == 0
        with pytest.raises(Refused, match="says A=2 was issued before, above the A=1") as got:
            again.release("llama-s1")
        assert got.value.reason == "RecordInvalid"
        again.close("llama-s1")
        assert again.open(JobSpec(job_id="llama", submission="s1", name="third"), hold=False).identity.admission == 3
    cluster.history.check()


# ------------------------------------------------------------------ issue 25, second round: floors and namespaces


def _floor(namespace: str, admission: int, *, name: str | None = None) -> dict[str, object]:
    """The floor of llama/s1 in ``namespace`` as a writer would send it, under its own name unless ``name``."""
    body = new_floor(namespace, "llama", "s1", admission)
    if name is not None:
        body["metadata"] = {**body["metadata"], "name": name}
    return body


def test_a_writer_of_one_namespace_cannot_create_or_raise_the_floor_of_another(cluster: FakeCluster) -> None:
    """The breaking schedule: a writer bound in namespace "a" only (dispatch-writer by a RoleBinding there,
    dispatch-node-reader cluster-wide, as the install docs bind them) writes the floor of a submission of
    namespace "b": created near the top before b's owner opens it, raised once b's owner has run it, or
    squatted under b's floor's name while naming a submission of "a". Each is refused by the API server."""
    for ns in ("a", "b"):
        cluster.server.create("", "namespaces", "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    with Adapter.connect("a", transport=cluster.transport(roles=(Binding("dispatch-writer", "a"),
                                                                   "dispatch-node-reader"))) as a:
        kube = a._async.core.kube
        with pytest.raises(Forbidden, match="ValidatingAdmissionPolicy 'dispatch-floors' with binding "
                                            "'dispatch-floors' denied request: a floor of namespace b is "
                                            "written only by whoever may create submissionrecords in b"):
            a._run(kube.create(SUBMISSION_FLOORS, _floor("b", ADMISSION_LIMIT)))
        with pytest.raises(Refused, match="a floor's name is the namespace it names, a dot and its record's "
                                          "name") as squat:
            a._run(kube.create(SUBMISSION_FLOORS, _floor("a", 5, name=floor_name("b", "llama", "s1"))))
        assert squat.value.code == 422
        assert a._run(kube.create(SUBMISSION_FLOORS, _floor("a", 5)))["spec"]["admission"] == 5  # its own
    with Adapter.connect("b", transport=cluster.transport(roles=(Binding("dispatch-writer", "b"),
                                                                   "dispatch-node-reader"))) as b:
        assert b.open(SPEC, hold=False).identity.admission == 1
    with Adapter.connect("a", transport=cluster.transport(roles=(Binding("dispatch-writer", "a"),
                                                                   "dispatch-node-reader"))) as a, \
            pytest.raises(Forbidden, match="a floor of namespace b is written only by whoever may patch "
                                           "submissionrecords in b"):
        a._run(a._async.core.kube.merge_patch(SUBMISSION_FLOORS, floor_name("b", "llama", "s1"),
                                              {"spec": {"admission": 7}}))
    got = cluster.server.get(n.DOMAIN, "submissionfloors", "", floor_name("b", "llama", "s1"))
    assert got is not None and got["spec"]["admission"] == 1


def test_a_floor_at_the_highest_a_stalls_its_submission_naming_admin_forget(team: Adapter,
                                                                               cluster: FakeCluster) -> None:
    """A cannot rise past ``ADMISSION_LIMIT`` (the CRDs' maximum): a submission whose floor (or record) is
    there can never number a new execution, and release says so, naming the way out."""
    with pytest.raises(Refused, match="should be less than or equal to 9007199254740991"):
        team._run(team._async.core.kube.create(SUBMISSION_FLOORS, _floor(NS, ADMISSION_LIMIT + 1)))
    team._run(team._async.core.kube.create(SUBMISSION_FLOORS, _floor(NS, ADMISSION_LIMIT)))
    team.open(SPEC)
    with pytest.raises(Refused, match=r"llama/s1 has been issued A=9007199254740991, the highest A dispatch "
                                      r"issues: no new execution of it can be numbered; `dispatch admin forget "
                                      r"llama s1 --yes`") as got:
        team.release("llama-s1")
    assert got.value.reason == "RecordInvalid"
    team.close("llama-s1")
    with Adapter.connect(NS, transport=cluster.transport(roles=ADMIN)) as admin:
        assert admin.forget("llama", "s1") is True
    assert team.open(JobSpec(job_id="llama", submission="s1", name="again"), hold=False).identity.admission == 1


def test_the_first_admission_creates_its_floor_in_one_write_and_later_ones_patch_it(
    team: Adapter, cluster: FakeCluster
) -> None:
    """A=1 is issued once per submission, so its floor does not exist yet: it is created at once, not after a
    patch the API answers 404 (one request fewer on every first admission: issue 37, decisions per second).
    A later admission patches the floor it finds. (``open`` reads the floor when it claims the submission.)"""
    mark = len(cluster.server.requests)
    assert run_and_close(team, cluster, SPEC) == 1
    floor_calls = [(m, p.split("?")[0]) for m, p, _ in cluster.server.requests[mark:]
                   if "/submissionfloors" in p and m != "GET"]
    assert floor_calls == [("POST", "/apis/dispatch.phpboyscout.uk/v1alpha1/submissionfloors")]
    assert floor_a(cluster) == 1
    mark = len(cluster.server.requests)
    assert run_and_close(team, cluster, JobSpec(job_id="llama", submission="s1", name="again")) == 2
    floor_calls = [(m, p.split("?")[0]) for m, p, _ in cluster.server.requests[mark:]
                   if "/submissionfloors" in p and m != "GET"]
    assert floor_calls == [("PATCH", f"/apis/dispatch.phpboyscout.uk/v1alpha1/submissionfloors/{FLOOR}")]
    assert floor_a(cluster) == 2
