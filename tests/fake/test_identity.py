"""Execution identity that holds: one submission is one object, A rises exactly once per admission and is
never reused, whatever the writers, conflicts, lost replies and third-party edits (issue: identity)."""

from __future__ import annotations

import asyncio
import re

import pytest

from dispatch import (
    ANNOTATION_ADMISSION,
    LABEL_ADMISSION,
    Adapter,
    AsyncAdapter,
    JobSpec,
    Refused,
    Unreachable,
)
from dispatch import _names as n
from dispatch._api import SUBMISSION_RECORDS
from dispatch._identity import record_name
from dispatch.testing import FakeCluster

NS = "default"
WRITER = ("dispatch-writer", "dispatch-node-reader")
ADMIN = ("dispatch-admin", *WRITER)
NAME = "llama-s1"
SPEC = JobSpec(job_id="llama", submission="s1")
RECORD = record_name("llama", "s1")


def two_writes(adapter: Adapter, cluster: FakeCluster) -> None:
    """A plain release as on Trainer before v2.2.1, whose webhook lets runtime patches change only in a write that
    leaves the TrainJob suspended: A raised, then the unsuspend (as once the cluster refused the one-write start)."""
    cluster.trainer_before_2_2_1 = True
    adapter.core.core.atomic_start = False


def record(cluster: FakeCluster, job_id: str = "llama", submission: str = "s1") -> dict[str, object] | None:
    return cluster.server.get(n.DOMAIN, "submissionrecords", NS, record_name(job_id, submission))


def record_a(cluster: FakeCluster, job_id: str = "llama", submission: str = "s1") -> int:
    rec = record(cluster, job_id, submission)
    assert rec is not None
    return int(rec["spec"]["admission"])  # type: ignore[index]


def tj_a(cluster: FakeCluster, name: str = NAME) -> int:
    tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", NS, name)
    assert tj is not None
    return int(tj["metadata"]["annotations"][ANNOTATION_ADMISSION])


def successful_writes(cluster: FakeCluster, start: int) -> list[tuple[str, str]]:
    """Writes that change objects (Events only report what a verb did)."""
    return [(m, p) for m, p, _ in cluster.server.requests[start:]
            if m in ("POST", "PUT", "PATCH", "DELETE") and not p.endswith("/events")]


# ---------------------------------------------------------------- one submission is one object


def test_a_second_open_of_a_submission_under_another_name_is_refused_naming_the_holder(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    adapter.open(SPEC)
    before = len(cluster.server.requests)
    with pytest.raises(Refused) as err:
        adapter.open(JobSpec(job_id="llama", submission="s1", name="llama-s1-b"))
    assert err.value.reason == "AlreadyExists"
    assert "llama/s1 already exists as trainjob llama-s1" in str(err.value)
    assert successful_writes(cluster, before) == []
    assert cluster.server.get("trainer.kubeflow.org", "trainjobs", NS, "llama-s1-b") is None


@pytest.mark.parametrize("pause_at", range(0, 6))
def test_two_concurrent_opens_of_one_submission_exactly_one_wins(cluster: FakeCluster, pause_at: int) -> None:
    """Interleave the second open's requests at every point of the first: exactly one TrainJob exists."""

    async def main() -> list[object]:
        a = AsyncAdapter.connect(NS, transport=cluster.transport(roles=WRITER))
        b = AsyncAdapter.connect(NS, transport=cluster.transport(roles=WRITER))
        gate = asyncio.Event()
        seen = {"n": 0}

        def hook(method: str, path: str) -> None:
            seen["n"] += 1
            if seen["n"] >= pause_at:
                gate.set()

        cluster.server.before_request = hook

        async def first() -> object:
            try:
                return await a.open(JobSpec(job_id="llama", submission="s1", name="llama-s1-a"), hold=False)
            except Exception as exc:
                return exc

        async def second() -> object:
            if pause_at:
                await gate.wait()  # the first open has sent pause_at requests
            try:
                return await b.open(JobSpec(job_id="llama", submission="s1", name="llama-s1-b"), hold=False)
            except Exception as exc:
                return exc

        try:
            return list(await asyncio.gather(first(), second()))
        finally:
            cluster.server.before_request = None
            await a.aclose()
            await b.aclose()

    results = asyncio.run(main())
    cluster.settle()
    wins = [r for r in results if not isinstance(r, Exception)]
    losses = [r for r in results if isinstance(r, Refused)]
    assert len(wins) == 1 and len(losses) == 1, results
    assert losses[0].reason == "AlreadyExists"
    names = [t["metadata"]["name"] for t in cluster.server.objects("trainer.kubeflow.org", "trainjobs", NS)]
    assert len(names) == 1
    cluster.history.check()


def test_a_closed_submission_reopens_and_goes_on_counting(adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(SPEC, hold=False)
    adapter.close(NAME)
    cluster.settle()
    cluster.advance(60)
    cluster.settle()
    assert record_a(cluster) == 1
    assert adapter.open(JobSpec(job_id="llama", submission="s1", name="llama-s1-again"), hold=False
                        ).identity.admission == 2


def test_close_of_a_claim_whose_trainjob_was_never_created_releases_it(adapter: Adapter, cluster: FakeCluster
                                                                       ) -> None:
    cluster.server.inject(method="POST", path="/trainjobs$", status="connect", times=1)
    with pytest.raises(Unreachable):
        adapter.open(SPEC)               # claimed, then the create was lost
    with pytest.raises(Refused, match="has not created it yet"):
        adapter.open(JobSpec(job_id="llama", submission="s1", name="other"))
    assert adapter.close(NAME) == ()     # releases the claim
    assert adapter.open(JobSpec(job_id="llama", submission="s1", name="other")).name == "other"


def test_the_same_open_again_resumes_its_claim(adapter: Adapter, cluster: FakeCluster) -> None:
    cluster.server.inject(method="POST", path="/trainjobs$", status="connect", times=1)
    with pytest.raises(Unreachable):
        adapter.open(SPEC)
    assert adapter.open(SPEC).name == NAME


def test_a_trainjob_deleted_behind_dispatchs_back_can_be_opened_again_and_goes_on_counting(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    adapter.open(SPEC, hold=False)
    cluster.server.delete("trainer.kubeflow.org", "trainjobs", NS, NAME)   # kubectl delete, not dispatch close
    cluster.settle()
    cluster.advance(60)
    cluster.settle()
    adapter.open(SPEC)
    assert adapter.release(NAME).admission == 2


def test_a_hand_edited_holder_does_not_let_a_second_object_claim_a_held_submission(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    adapter.open(SPEC)
    cluster.server.update(n.DOMAIN, "submissionrecords", NS, RECORD,
                          lambda o: o["spec"]["trainJob"].update(name="nobody", uid=""))
    with pytest.raises(Refused, match="already exists as trainjob llama-s1"):
        adapter.open(JobSpec(job_id="llama", submission="s1", name="second"))
    cluster.server.delete(n.DOMAIN, "submissionrecords", NS, RECORD)
    with pytest.raises(Refused, match="already exists as trainjob llama-s1"):
        adapter.open(JobSpec(job_id="llama", submission="s1", name="third"))


# ---------------------------------------------------------------- A rises exactly once per admission


def test_concurrent_releases_of_one_object_admit_once_with_one_number(cluster: FakeCluster) -> None:
    with Adapter.connect(NS, transport=cluster.transport(roles=WRITER)) as a:
        a.open(SPEC)

    async def main() -> list[object]:
        adapters = [AsyncAdapter.connect(NS, transport=cluster.transport(roles=WRITER)) for _ in range(4)]
        try:
            return list(await asyncio.gather(*(x.release(NAME) for x in adapters), return_exceptions=True))
        finally:
            for x in adapters:
                await x.aclose()

    results = asyncio.run(main())
    got = {r.admission for r in results if not isinstance(r, BaseException)}  # type: ignore[attr-defined]
    assert got == {1}, results
    assert tj_a(cluster) == 1 and record_a(cluster) == 1
    cluster.settle()
    assert {p["metadata"]["labels"][LABEL_ADMISSION] for p in cluster.pods(NAME)} == {"1"}
    cluster.history.check()


@pytest.mark.parametrize("write", ["record", "trainjob", "unsuspend"])
def test_a_lost_reply_after_the_server_applied_the_write_does_not_raise_a_again(
    adapter: Adapter, cluster: FakeCluster, write: str
) -> None:
    two_writes(adapter, cluster)  # the raise and the unsuspend are two writes there
    adapter.open(SPEC)
    path = {"record": rf"/submissionrecords/{RECORD}$", "trainjob": rf"/trainjobs/{NAME}$",
            "unsuspend": rf"/trainjobs/{NAME}$"}[write]
    if write == "unsuspend":  # the second PATCH of the TrainJob is the unsuspend
        done = {"n": 0}

        def lose_second(method: str, p: str) -> None:
            if method == "PATCH" and re.search(path, p):
                done["n"] += 1
                if done["n"] == 2:
                    cluster.server.inject(method="PATCH", path=path, status="timeout", after=True)

        cluster.server.before_request = lose_second
    else:
        cluster.server.inject(method="PATCH", path=path, status="timeout", after=True)
    try:
        with pytest.raises(Unreachable):
            adapter.release(NAME)          # the write landed, its reply did not
    finally:
        cluster.server.before_request = None
    assert adapter.release(NAME).admission == 1   # the retry finds it: a first admission is A=1
    assert record_a(cluster) == 1 and tj_a(cluster) == 1


def test_a_conflict_with_trainers_status_write_retries_the_same_number(adapter: Adapter, cluster: FakeCluster
                                                                      ) -> None:
    adapter.open(SPEC)
    cluster.server.inject(method="PATCH", path=rf"/submissionrecords/{RECORD}$", status=409, times=2)
    cluster.server.inject(method="PATCH", path=rf"/trainjobs/{NAME}$", status=409, times=2)
    assert adapter.release(NAME).admission == 1


def test_twenty_concurrent_releases_in_one_namespace_see_no_conflict_on_dispatchs_records(
    cluster: FakeCluster,
) -> None:
    names = [f"job-s{i}" for i in range(20)]
    with Adapter.connect(NS, transport=cluster.transport(roles=WRITER)) as a:
        for i in range(20):
            a.open(JobSpec(job_id="job", submission=f"s{i}"))

    async def main() -> list[object]:
        adapters = [AsyncAdapter.connect(NS, transport=cluster.transport(roles=WRITER)) for _ in names]
        try:
            return list(await asyncio.gather(*(x.release(name) for x, name in zip(adapters, names, strict=True)),
                                             return_exceptions=True))
        finally:
            for x in adapters:
                await x.aclose()

    start = len(cluster.server.requests)
    results = asyncio.run(main())
    assert [r.admission for r in results] == [1] * 20  # type: ignore[attr-defined]
    records = [p for m, p, _ in cluster.server.requests[start:] if m == "PATCH" and "/submissionrecords/" in p]
    assert len(records) == len(set(records)) == 20   # each release wrote its own record once: no retry


# ---------------------------------------------------------------- the record is hard to break


def test_a_deleted_record_of_a_submission_that_ran_is_refused_naming_it(adapter: Adapter, cluster: FakeCluster
                                                                       ) -> None:
    adapter.open(SPEC, hold=False)
    adapter.hold(NAME)
    cluster.settle()
    cluster.advance(60)
    cluster.settle()
    cluster.server.delete(n.DOMAIN, "submissionrecords", NS, RECORD)
    with pytest.raises(Refused) as err:
        adapter.release(NAME)
    assert err.value.reason == "RecordInvalid"
    assert f"identity record submissionrecords/{RECORD} of llama/s1 is missing" in str(err.value)
    assert "A=1" in str(err.value)


def test_the_api_server_refuses_to_lower_a_record(adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(SPEC, hold=False)
    with pytest.raises(Refused, match="A never decreases"):
        adapter._run(adapter.core.kube.merge_patch(
            SUBMISSION_RECORDS, RECORD, {"spec": {"admission": 0}}))
    with pytest.raises(Refused, match="names never changes"):
        adapter._run(adapter.core.kube.merge_patch(SUBMISSION_RECORDS, RECORD, {"spec": {"submission": "s2"}}))
    adapter._run(adapter.core.kube.merge_patch(SUBMISSION_RECORDS, RECORD,
                                               {"spec": {"clusters": ["worker-1", "worker-2"]}}))
    with pytest.raises(Refused, match="forgets a MultiKueue worker only together with a raise of A"):
        adapter._run(adapter.core.kube.merge_patch(SUBMISSION_RECORDS, RECORD, {"spec": {"clusters": ["worker-2"]}}))
    assert record_a(cluster) == 1


def test_a_record_that_names_another_submission_is_refused(adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(SPEC)
    cluster.server.update(n.DOMAIN, "submissionrecords", NS, RECORD,
                          lambda o: o["spec"]["trainJob"].update(name="someone-else"), admit=False)
    with pytest.raises(Refused, match="held by someone-else"):
        adapter.release(NAME)


def test_an_unparsable_admission_annotation_is_a_clear_refusal_and_status_still_answers(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    adapter.open(SPEC)
    cluster.server.update("trainer.kubeflow.org", "trainjobs", NS, NAME,
                          lambda o: o["metadata"]["annotations"].update({n.ANNOTATION_ADMISSION: "١٢"}))
    with pytest.raises(Refused, match=r"annotation dispatch.phpboyscout.uk/admission is '١٢', not a number"):
        adapter.release(NAME)
    assert adapter.inspect(NAME).identity.admission == 0


def test_a_record_kind_that_is_not_installed_names_the_crd(adapter: Adapter, cluster: FakeCluster) -> None:
    cluster.server.remove_kind(n.DOMAIN, "submissionrecords")
    with pytest.raises(Refused, match="identity-record CRD is not installed"):
        adapter.open(SPEC)


# ---------------------------------------------------------------- reads and errors


def test_a_compaction_in_the_middle_of_a_consistent_read_is_retried(adapter: Adapter, cluster: FakeCluster
                                                                    ) -> None:
    adapter.open(SPEC)
    cluster.server.inject(method="GET", path="/pods$", status=410, times=1)
    assert adapter.release(NAME).admission == 1


def test_a_compaction_that_keeps_happening_is_unreachable_not_refused(adapter: Adapter, cluster: FakeCluster
                                                                      ) -> None:
    adapter.open(SPEC)
    cluster.server.inject(method="GET", path="/pods$", status=410, times=50)
    with pytest.raises(Unreachable) as err:
        adapter.release(NAME)
    assert err.value.reason == "Expired"


def test_close_records_a_before_it_deletes(adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(SPEC, hold=False)
    order = [(m, p) for m, p, _ in cluster.server.requests]
    start = len(order)
    adapter.close(NAME)
    writes = successful_writes(cluster, start)
    assert "/submissionrecords/" in writes[0][1] and writes[-1][0] == "DELETE"
    rec = record(cluster)
    assert rec is not None and rec["spec"]["trainJob"]["name"] == ""  # type: ignore[index]


# ---------------------------------------------------------------- admin and migration


def test_forget_is_refused_while_held_and_then_lets_the_submission_count_from_one(cluster: FakeCluster) -> None:
    adapter = Adapter.connect(NS, transport=cluster.transport(roles=ADMIN))
    adapter.open(SPEC, hold=False)
    with pytest.raises(Refused, match="close it first"):
        adapter.forget("llama", "s1")
    adapter.close(NAME)
    assert adapter.forget("llama", "s1") is True
    assert record(cluster) is None
    adapter.shutdown()


def test_migrate_folds_the_old_ledger_and_existing_objects_into_records(cluster: FakeCluster) -> None:
    adapter = Adapter.connect(NS, transport=cluster.transport(roles=ADMIN))
    cluster.server.create("", "configmaps", NS, {"apiVersion": "v1", "kind": "ConfigMap",
                                                 "metadata": {"name": "dispatch-admissions"},
                                                 "data": {"5.llama.s9": "4", "3.job.s.1": "2"}})
    assert adapter.migrate() == (2, 0)
    assert record_a(cluster, "llama", "s9") == 4 and record_a(cluster, "job", "s.1") == 2
    assert cluster.server.get("", "configmaps", NS, "dispatch-admissions") is None
    assert adapter.open(JobSpec(job_id="llama", submission="s9"), hold=False).identity.admission == 5
    adapter.shutdown()


def test_the_first_open_after_an_upgrade_continues_from_the_old_ledger(adapter: Adapter, cluster: FakeCluster
                                                                       ) -> None:
    cluster.server.create("", "configmaps", NS, {"apiVersion": "v1", "kind": "ConfigMap",
                                                 "metadata": {"name": "dispatch-admissions"},
                                                 "data": {"5.llama.s1": "3"}})
    assert adapter.open(SPEC, hold=False).identity.admission == 4


# ---------------------------------------------------------------- A in the processes


def test_every_trainer_container_gets_its_identity_from_its_pods_labels(adapter: Adapter, cluster: FakeCluster
                                                                        ) -> None:
    adapter.open(SPEC, hold=False)
    tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", NS, NAME)
    assert tj is not None
    env = {e["name"]: e for e in tj["spec"]["trainer"]["env"]}
    assert env["DISPATCH_ADMISSION"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        f"metadata.labels['{LABEL_ADMISSION}']")
    assert env["DISPATCH_JOB_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{n.LABEL_JOB_ID}']"
    assert env["DISPATCH_SUBMISSION"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        f"metadata.labels['{n.LABEL_SUBMISSION}']")
