"""The admission core: the reads and writes of the admission protocol, with no policy of its own.

Both the library verbs (``_adapter``) and the Kueue controller admit through this one place:

* ``read`` takes one consistent read of one or many objects' lower layers (JobSet, child Jobs, the
  namespace's pods selected two independent ways and pinned to one resourceVersion, the Nodes they sit
  on) and parses it once into views;
* the identity record (``_identity``) is claimed, read, and has A issued in it before any TrainJob
  carries that A;
* ``raise_trainjob`` writes A on the TrainJob and into dispatch's runtime patch entry, and ``unsuspend``
  starts the execution, each conditioned on the resourceVersion it read.

What to decide from a read, which A to issue and whether a decision still holds after a conflict are
the pure functions of ``_decision``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _api as api
from . import _decision as d
from . import _identity as ident
from . import _kueue as kq
from . import _names as n
from . import _trainer as tr
from ._kube import Kube
from ._records import JobSpec
from ._views import POD_FINALIZER, JobSetView, JobView, NodeView, PodView, labels_of, name_of, parse_count
from .errors import DispatchError, FieldCause, Forbidden, InvalidInput, NotFound, Refused, Unreachable

READ_ATTEMPTS = 3
"""A consistent read that meets a compaction (410) is taken again from the start, this often."""


@dataclass(frozen=True)
class Target:
    """One object to read: its TrainJob name and its dispatch identity ("" if it has none)."""

    name: str
    job_id: str = ""
    submission: str = ""

    @staticmethod
    def of(tj: tr.TrainJobView) -> Target:
        return Target(tj.name, tj.job_id, tj.submission)


@dataclass(frozen=True)
class Snapshot:
    """What one consistent read saw of one object's lower layers."""

    jobset: JobSetView | None
    jobs: tuple[JobView, ...]
    pods: tuple[PodView, ...]
    nodes: Mapping[str, NodeView]
    resource_version: str

    def verdict(self, target: Target) -> d.Verdict:
        return d.decide(name=target.name, job_id=target.job_id, submission=target.submission, pods=self.pods,
                        nodes=self.nodes, jobset=self.jobset, jobs=self.jobs)

    def object_pods(self, target: Target) -> list[PodView]:
        return d.object_pods(self.pods, name=target.name, job_id=target.job_id, submission=target.submission)


Obj = dict[str, Any]


def _no_record_kind(exc: NotFound) -> DispatchError:
    """A missing record kind names what to install; a missing record stays NotFound."""
    if "the server could not find the requested resource" in exc.message:
        return Refused(f"the {api.SUBMISSION_RECORDS.describe()} kind is not served: dispatch's identity-record "
                       "CRD is not installed (kubectl apply -k deploy/)", reason="NoRecordKind", code=404)
    return exc


def _in(values: Iterable[str]) -> str:
    return f"({','.join(sorted(set(values)))})"


class Core:
    """The admission protocol's reads and writes for one namespace."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    @property
    def namespace(self) -> str:
        return self.kube.namespace

    # ------------------------------------------------------------------ consistent reads

    async def read(self, targets: Sequence[Target], *, list_jobsets: bool = False, lower: bool = True
                   ) -> dict[str, Snapshot]:
        """One consistent read for one or many objects of the namespace, keyed by TrainJob name.

        JobSets (a get each, sent together, or one list when ``list_jobsets``), then child Jobs, then the
        pods by dispatch's labels at revision R (a quorum list, paged, RV never resent) and by jobset-name
        pinned to R (resourceVersionMatch=Exact), then the Nodes those pods sit on. Set-based selectors
        make k objects cost about as much as one and no more than their own pods. ``lower=False`` reads
        pods and Nodes only (``ceased`` and ``close``). A compaction mid-read (410) takes the read again.
        """
        for attempt in range(READ_ATTEMPTS):
            try:
                return await self._read(targets, list_jobsets=list_jobsets, lower=lower)
            except DispatchError as exc:
                if exc.code != 410:
                    raise
                if attempt + 1 == READ_ATTEMPTS:
                    raise Unreachable(
                        f"the API server compacted away the revision of a consistent read {READ_ATTEMPTS} times "
                        "in a row; retry", reason="Expired", code=410,
                    ) from exc
        raise AssertionError("unreachable")

    async def _read(self, targets: Sequence[Target], *, list_jobsets: bool, lower: bool) -> dict[str, Snapshot]:
        names = sorted({t.name for t in targets})
        if not names:
            return {}
        jobsets: dict[str, JobSetView | None] = {}
        jobs: list[JobView] = []
        in_names = f"{n.JOBSET_NAME_LABEL} in {_in(names)}"
        if lower:
            if list_jobsets:
                listed = {name_of(j): j for j in (await self.kube.list(api.JOBSETS)).items}
                jobsets = {name: JobSetView.from_obj(listed[name]) if name in listed else None for name in names}
            else:  # one get each, sent together: the reads' latencies overlap, their order does not matter
                got = await asyncio.gather(*(self.kube.get_or_none(api.JOBSETS, name) for name in names))
                jobsets = {name: JobSetView.from_obj(o) if o is not None else None
                           for name, o in zip(names, got, strict=True)}
            jobs = [JobView.from_obj(j) for j in (await self.kube.list(api.JOBS, labels=in_names)).items]
        idents = {(t.job_id, t.submission) for t in targets if t.job_id and t.submission}
        if idents:
            selector = (f"{n.LABEL_JOB_ID} in {_in(i for i, _ in idents)},"
                        f"{n.LABEL_SUBMISSION} in {_in(s for _, s in idents)}")
            first = await self.kube.list(api.PODS, labels=selector)
            second = await self.kube.list(api.PODS, labels=in_names, resource_version=first.resource_version,
                                          exact=True)
            raw, rv = first.items + second.items, first.resource_version
        else:
            only = await self.kube.list(api.PODS, labels=in_names)
            raw, rv = only.items, only.resource_version
        pods = [PodView.from_obj(p) for p in raw]
        nodes = await self.nodes(pods)
        by_name: dict[str, list[PodView]] = {}
        by_ident: dict[tuple[str, str], list[PodView]] = {}
        for pod in pods:  # index once: each object then takes its own pods in O(its pods)
            by_name.setdefault(pod.jobset_name, []).append(pod)
            by_ident.setdefault((pod.job_id, pod.submission), []).append(pod)
        jobs_of: dict[str, list[JobView]] = {}
        for job in jobs:
            jobs_of.setdefault(job.jobset_name, []).append(job)
        out: dict[str, Snapshot] = {}
        for t in targets:
            mine = by_name.get(t.name, []) + (by_ident.get((t.job_id, t.submission), []) if t.job_id else [])
            out[t.name] = Snapshot(jobsets.get(t.name), tuple(jobs_of.get(t.name, [])), tuple(mine), nodes, rv)
        return out

    async def read_namespace(self, targets: Sequence[Target]) -> dict[str, Snapshot]:
        """One consistent read of the whole namespace for many objects, keyed by TrainJob name (``find``).

        The same read as ``read`` with selectors by label key instead of value sets (one request each,
        whatever the number of objects, where a set of thousands of names would not fit a URL): every pod
        carrying dispatch's job-id label at revision R and every pod carrying jobset-name pinned to R,
        every JobSet and every Job that names its JobSet, and the Nodes as one list (each pod that may run
        needs its Node; a reader without ``list`` sees them unreadable). A kind that is not served reads as
        empty. Each object then keeps only its own candidates, so deciding costs follow the objects.
        """
        if not targets:
            return {}
        first = await self.kube.list(api.PODS, labels=n.LABEL_JOB_ID)
        second = await self.kube.list(api.PODS, labels=n.JOBSET_NAME_LABEL, resource_version=first.resource_version,
                                      exact=True)
        pods = [PodView.from_obj(p) for p in first.items + second.items]
        jobsets = {name_of(j): JobSetView.from_obj(j) for j in await self._list_or_empty(api.JOBSETS)}
        jobs = [JobView.from_obj(j) for j in await self._list_or_empty(api.JOBS, n.JOBSET_NAME_LABEL)]
        nodes = await self.listed_nodes(pods)
        by_name: dict[str, list[PodView]] = {}
        by_ident: dict[tuple[str, str], list[PodView]] = {}
        for pod in pods:
            by_name.setdefault(pod.jobset_name, []).append(pod)
            if pod.job_id:
                by_ident.setdefault((pod.job_id, pod.submission), []).append(pod)
        jobs_of: dict[str, list[JobView]] = {}
        for job in jobs:
            jobs_of.setdefault(job.jobset_name, []).append(job)
        out: dict[str, Snapshot] = {}
        for t in targets:
            mine = by_name.get(t.name, []) + (by_ident.get((t.job_id, t.submission), []) if t.job_id else [])
            out[t.name] = Snapshot(jobsets.get(t.name), tuple(jobs_of.get(t.name, [])), tuple(mine), nodes,
                                   first.resource_version)
        return out

    async def jobs_of(self, name: str) -> list[JobView]:
        """The child Jobs of one JobSet (none where the Job kind cannot be read as such)."""
        return [JobView.from_obj(j) for j in await self._list_or_empty(api.JOBS, f"{n.JOBSET_NAME_LABEL}={name}")]

    async def _list_or_empty(self, res: api.Res, labels: str | None = None) -> list[Obj]:
        try:
            return (await self.kube.list(res, labels=labels)).items
        except NotFound:
            return []

    async def workloads_by_owner(self) -> dict[str, kq.WorkloadView]:
        """Every Workload of the namespace by its owner's uid (empty where Kueue is not installed)."""
        out: dict[str, kq.WorkloadView] = {}
        for w in await self._list_or_empty(api.WORKLOADS):
            uid = labels_of(w).get(n.KUEUE_JOB_UID_LABEL)
            if uid:
                out[uid] = kq.WorkloadView.from_obj(w)
        return out

    async def read_one(self, target: Target, *, lower: bool = True) -> Snapshot:
        return (await self.read([target], lower=lower))[target.name]

    async def nodes(self, pods: Iterable[PodView]) -> dict[str, NodeView]:
        """Get each Node a pod that may run sits on (get only: ``ceased`` needs no list permission)."""
        names = sorted({p.node for p in pods if p.node and p.may_run})
        got = await asyncio.gather(*(self._node(name) for name in names))
        return dict(zip(names, got, strict=True))

    async def listed_nodes(self, pods: Iterable[PodView]) -> dict[str, NodeView]:
        """The Nodes the pods that may run sit on, from one list of every Node (for a read of many)."""
        wanted = {p.node for p in pods if p.node and p.may_run}
        if not wanted:
            return {}
        try:
            listed = {name_of(o): NodeView.from_obj(o) for o in (await self.kube.list(api.NODES)).items}
        except Forbidden:
            return {name: NodeView.unreadable(name) for name in wanted}
        return {name: listed.get(name) or NodeView.gone(name) for name in wanted}

    async def _node(self, name: str) -> NodeView:
        try:
            return NodeView.from_obj(await self.kube.get(api.NODES, name))
        except NotFound:
            return NodeView.gone(name)
        except Forbidden:
            return NodeView.unreadable(name)

    # ------------------------------------------------------------------ dispatch's pod finalizer

    async def free(self, pods: Iterable[PodView], nodes: Mapping[str, NodeView]) -> list[str]:
        """Remove dispatch's finalizer from every pod whose end is proven (``_decision.releasable``);
        returns the names freed. A pod that changed since it was read keeps its finalizer until the next
        pass (or the controller) looks again; one this caller may not patch is left to the controller."""
        proven = d.releasable(pods, nodes)
        done = await asyncio.gather(*(self.remove_finalizer(p) for p in proven))
        return [p.name for p, ok in zip(proven, done, strict=True) if ok]

    async def delete_pod(self, pod: PodView, *, grace_seconds: int | None = None) -> bool:
        """Delete a pod as read (conditioned on its uid and resourceVersion). The controller deletes a pod
        its kubelet rejected, so that the kubelet tears it down and writes every container's end (which
        proves it; dispatch's finalizer keeps the object until then); ``admin release-pod`` deletes a
        pod whose end the operator vouched for that nothing else deletes (a Job keeps failed pods).
        False if the pod changed or is gone."""
        try:
            await self.kube.delete(api.PODS, pod.name, pod.namespace or None, grace_seconds=grace_seconds,
                                   uid=pod.uid, resource_version=pod.resource_version)
        except NotFound:
            return False
        except Unreachable as exc:
            if exc.code == 409:
                return False
            raise
        return True

    async def remove_finalizer(self, pod: PodView, *, forbidden_ok: bool = True) -> bool:
        """Drop dispatch's finalizer from ``pod`` as read: a merge patch of the finalizers list conditioned
        on the resourceVersion read, so a concurrent change (another finalizer added or removed, a new
        status) is never overwritten. False if the pod changed (409), is gone, or (``forbidden_ok``)
        this caller lacks ``patch`` on pods."""
        if POD_FINALIZER not in pod.finalizers:
            return False
        patch = {"metadata": {"resourceVersion": pod.resource_version,
                              "finalizers": [f for f in pod.finalizers if f != POD_FINALIZER]}}
        try:
            await self.kube.merge_patch(api.PODS, pod.name, patch, pod.namespace or None)
        except NotFound:
            return False
        except Forbidden:
            if forbidden_ok:
                return False
            raise
        except Unreachable as exc:
            if exc.code == 409:
                return False
            raise
        return True

    # ------------------------------------------------------------------ TrainJobs and Workloads

    async def check_grace_kept(self, body: dict[str, object]) -> None:
        """Trainer before v2.3 prunes terminationGracePeriodSeconds from runtime patches silently; a
        dry-run create shows what the server would keep, so the user hears it, not nothing."""
        try:
            stored = await self.kube.create(api.TRAINJOBS, body, dry_run=True)
        except NotFound:
            return  # the create itself will explain the missing kind
        if not tr.grace_kept(stored):
            raise InvalidInput(
                "invalid input: termination_grace_period_seconds",
                reason="Invalid",
                causes=[FieldCause(
                    "termination_grace_period_seconds",
                    "this cluster's Trainer drops terminationGracePeriodSeconds from runtime patches "
                    "(it needs Trainer v2.3 or later); set it in the training runtime instead",
                    "FieldValueNotSupported",
                )],
            )

    async def runtime_jobs(self, spec: JobSpec) -> tuple[list[str], str | None]:
        """The runtime's replicatedJob names, and a warning if its Jobs replace deleting pods at once
        (Trainer's runtime patches cannot set podReplacementPolicy, so dispatch can only say so)."""
        res = api.CLUSTER_RUNTIMES if spec.runtime_kind == "ClusterTrainingRuntime" else api.RUNTIMES
        try:
            runtime = await self.kube.get(res, spec.runtime)
        except NotFound as exc:
            if any(t in exc.message for t in ("could not find the requested resource", "404 page not found")):
                raise NotFound("the TrainJob kind is not served: is Kubeflow Trainer installed in this cluster?",
                               reason=exc.reason, code=exc.code) from exc
            raise NotFound(
                f"{spec.runtime_kind} {spec.runtime} not found"
                + (" in namespace " + self.namespace if res.namespaced else ""),
                reason=exc.reason, code=exc.code, causes=[FieldCause("runtime", "not found", "NotFound")],
            ) from exc
        names = tr.runtime_jobs(runtime)
        if not names:
            raise InvalidInput(f"{spec.runtime_kind} {spec.runtime} has no replicatedJobs", reason="Invalid")
        return names, d.runtime_replacement_warning(spec.runtime_kind, spec.runtime,
                                                    tr.runtime_replacement_policies(runtime))


    async def trainjob(self, name: str) -> tr.TrainJobView:
        try:
            return tr.TrainJobView.from_obj(await self.kube.get(api.TRAINJOBS, name))
        except NotFound as exc:
            raise NotFound(
                f"trainjob {name} not found in namespace {self.namespace}"
                + (" (is Kubeflow Trainer installed?)" if "the server could not find" in exc.message else ""),
                reason=exc.reason, code=exc.code,
            ) from exc

    async def trainjob_or_none(self, name: str) -> tr.TrainJobView | None:
        obj = await self.kube.get_or_none(api.TRAINJOBS, name)
        return tr.TrainJobView.from_obj(obj) if obj is not None else None

    async def workload_of(self, tj: tr.TrainJobView) -> kq.WorkloadView | None:
        """The Kueue Workload that owns the TrainJob's admission, if Kueue manages it (label or not)."""
        if not tj.ref.uid:
            return None
        try:
            found = await self.kube.list(api.WORKLOADS, labels=kq.uid_selector([tj.ref.uid]))
        except NotFound:
            return None  # Kueue is not installed
        return kq.WorkloadView.from_obj(found.items[0]) if found.items else None

    async def our_checks(self, controller_name: str = n.CONTROLLER_NAME) -> set[str] | None:
        """Names of the AdmissionChecks owned by ``controller_name``; None if they cannot be listed."""
        try:
            return kq.checks_owned((await self.kube.list(api.ADMISSION_CHECKS)).items, controller_name)
        except (NotFound, Forbidden):
            return None

    async def set_active(self, workload: kq.WorkloadView, active: bool) -> None:
        if workload.active != active:
            await self.kube.merge_patch(api.WORKLOADS, workload.ref.name, kq.active_patch(active))

    # ------------------------------------------------------------------ the identity record

    async def record(self, job_id: str, submission: str) -> ident.RecordView | None:
        try:
            obj = await self.kube.get(api.SUBMISSION_RECORDS, ident.record_name(job_id, submission))
        except NotFound as exc:
            missing = _no_record_kind(exc)
            if missing is not exc:
                raise missing from exc
            return None
        return ident.RecordView.from_obj(obj)

    async def records(self, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], ident.RecordView | None]:
        """The records of many submissions: one list by their labels (set-based, so its cost follows
        these submissions, not the namespace), each checked against its hashed name; one get for one."""
        keys = sorted(set(pairs))
        if len(keys) < 2:
            return {key: await self.record(*key) for key in keys}
        selector = (f"{n.LABEL_JOB_ID} in {_in(j for j, _ in keys)},"
                    f"{n.LABEL_SUBMISSION} in {_in(s for _, s in keys)}")
        try:
            listed = (await self.kube.list(api.SUBMISSION_RECORDS, labels=selector)).items
        except NotFound as exc:
            raise _no_record_kind(exc) from exc
        by_name = {v.name: v for v in map(ident.RecordView.from_obj, listed)}
        out: dict[tuple[str, str], ident.RecordView | None] = {}
        for key in keys:
            found = by_name.get(ident.record_name(*key))
            # a record whose labels were edited away is not missing: a get by its name decides
            out[key] = found if found is not None else await self.record(*key)
        return out

    async def _create_record(self, body: dict[str, object]) -> ident.RecordView:
        try:
            return ident.RecordView.from_obj(await self.kube.create(api.SUBMISSION_RECORDS, body))
        except NotFound as exc:
            raise _no_record_kind(exc) from exc

    async def claim(self, job_id: str, submission: str, trainjob: str) -> ident.RecordView:
        """Claim a submission for ``trainjob``: only one caller can win it.

        A new submission's record is created (A continues from the old namespace ledger if it has one).
        An existing record is taken over only when its holder is gone (closed, or deleted after it had
        run); one held by a TrainJob that exists, or claimed by another name not created yet, is refused
        as AlreadyExists naming that object. Re-running the same open (same name) resumes its claim.
        """
        for _ in range(5):
            record = await self.record(job_id, submission)
            if record is None:
                other = await self._live_trainjob_of(job_id, submission)  # opened before records, or record lost
                if other is not None:
                    raise Refused(f"submission {job_id}/{submission} already exists as trainjob {other.name}; "
                                  "choose a new submission", reason="AlreadyExists")
                floor = await self._legacy_floor(job_id, submission)
                try:
                    return await self._create_record(ident.new_record(job_id, submission, trainjob, admission=floor))
                except Refused as exc:
                    if exc.reason == "AlreadyExists":
                        continue
                    raise
            if record.problems or (record.job_id, record.submission) != (job_id, submission):
                raise Refused(f"{record.describe()} of {job_id}/{submission} cannot be trusted: "
                              f"{'; '.join(record.problems) or 'it names another submission'}",
                              reason="RecordInvalid")
            holder = await self.trainjob_or_none(record.trainjob) if record.trainjob else None
            held = holder is not None and (not record.trainjob_uid or holder.ref.uid == record.trainjob_uid)
            if not held:
                # the record's holder may have been edited: any live TrainJob of the submission holds it
                other = await self._live_trainjob_of(job_id, submission)
                if other is not None and other.name != trainjob:
                    raise Refused(f"submission {job_id}/{submission} already exists as trainjob {other.name}; "
                                  "choose a new submission", reason="AlreadyExists")
            if record.trainjob == trainjob and not held and not record.trainjob_uid:
                return record  # the same open again: its claim stands
            if held or (record.trainjob and not record.trainjob_uid and holder is None):
                what = (f"as trainjob {record.trainjob}" if held
                        else f"by an open of trainjob {record.trainjob} that has not created it yet "
                             f"(if that open failed, `dispatch close {record.trainjob}` releases the claim)")
                raise Refused(f"submission {job_id}/{submission} already exists {what}; choose a new submission",
                              reason="AlreadyExists")
            try:
                obj = await self.kube.merge_patch(api.SUBMISSION_RECORDS, record.name,
                                                  ident.holder_patch(record, trainjob))
            except Unreachable as exc:
                if exc.code == 409:
                    continue
                raise
            return ident.RecordView.from_obj(obj)
        raise Unreachable(f"the identity record of {job_id}/{submission} kept changing; retry", reason="Conflict",
                          code=409)

    async def _live_trainjob_of(self, job_id: str, submission: str) -> tr.TrainJobView | None:
        listed = (await self.kube.list(api.TRAINJOBS, labels=f"{n.LABEL_JOB_ID}={job_id},"
                                                              f"{n.LABEL_SUBMISSION}={submission}")).items
        live = [v for v in map(tr.TrainJobView.from_obj, listed) if not v.deleting]
        return live[0] if live else None

    async def unclaim(self, record: ident.RecordView, *, admission: int = 0) -> None:
        """Release a submission's claim (``close``), lifting A to ``admission`` if it is higher; the
        record outlives the object, so a re-opened submission goes on counting."""
        current: ident.RecordView | None = record
        for _ in range(5):
            if current is None:
                return
            try:
                await self.kube.merge_patch(api.SUBMISSION_RECORDS, current.name,
                                            ident.holder_patch(current, "", admission=admission))
                return
            except Unreachable as exc:
                if exc.code != 409:
                    raise
            current = await self.record(record.job_id, record.submission)
            if current is not None and current.trainjob != record.trainjob:
                return  # someone else holds it now
        raise Unreachable(f"{record.describe()} kept changing; retry", reason="Conflict", code=409)

    async def claims_of(self, trainjob: str) -> list[ident.RecordView]:
        """Records held by ``trainjob`` (by their holder label): a claim whose TrainJob may not exist."""
        try:
            found = await self.kube.list(api.SUBMISSION_RECORDS, labels=f"{ident.LABEL_HOLDER}={trainjob}")
        except NotFound as exc:
            raise _no_record_kind(exc) from exc
        return [r for r in map(ident.RecordView.from_obj, found.items) if r.trainjob == trainjob]

    async def forget(self, job_id: str, submission: str) -> ident.RecordView | None:
        """Delete a submission's record (an admin's decision: the submission then counts from 1 again).
        Refused while a TrainJob holds it."""
        record = await self.record(job_id, submission)
        if record is None:
            return None
        holder = await self.trainjob_or_none(record.trainjob) if record.trainjob else None
        if holder is not None:
            raise Refused(f"submission {job_id}/{submission} is held by trainjob {holder.name}; close it first",
                          reason="InUse")
        await self.kube.delete(api.SUBMISSION_RECORDS, record.name, uid=record.ref.uid or None)
        return record

    async def migrate(self) -> tuple[int, int]:
        """Fold the old namespace ledger and every dispatch TrainJob's A into identity records, then delete
        the ledger. Returns (records created, records raised). Safe to run again; never lowers a record."""
        wanted: dict[tuple[str, str], tuple[int, str]] = {}
        ledger = await self.kube.get_or_none(api.CONFIGMAPS, ident.LEGACY_LEDGER)
        data = ledger.get("data") if ledger is not None else None
        for key, value in (data.items() if isinstance(data, dict) else []):
            pair = ident.parse_legacy_key(str(key))
            count = parse_count(value)
            if pair is None or count is None:
                raise Refused(f"the old ledger {ident.LEGACY_LEDGER} has an entry {str(key)[:60]!r}="
                              f"{str(value)[:20]!r} that does not parse; fix or remove it, then migrate again",
                              reason="RecordInvalid")
            wanted[pair] = (max(count, wanted.get(pair, (0, ""))[0]), "")
        for obj in (await self.kube.list(api.TRAINJOBS, labels=n.LABEL_JOB_ID)).items:
            tj = tr.TrainJobView.from_obj(obj)
            if tj.labelled:
                best = max(tj.admission, tj.patch_admission, wanted.get((tj.job_id, tj.submission), (0, ""))[0])
                wanted[(tj.job_id, tj.submission)] = (best, tj.name)
        created = raised = 0
        for (job_id, submission), (admission, holder) in sorted(wanted.items()):
            record = await self.record(job_id, submission)
            if record is None:
                await self._create_record(ident.new_record(job_id, submission, holder, admission=admission))
                created += 1
            elif record.admission < admission:
                await self.kube.merge_patch(api.SUBMISSION_RECORDS, record.name,
                                            {"metadata": {"resourceVersion": record.ref.resource_version},
                                             "spec": {"admission": admission}})
                raised += 1
        if ledger is not None:
            await self.kube.delete(api.CONFIGMAPS, ident.LEGACY_LEDGER)
        return created, raised

    async def issue(self, record: ident.RecordView | None, tj: tr.TrainJobView, admission: int,
                    token: str) -> ident.RecordView:
        """Issue A in the record (creating it for an object that has none and never ran), bound to the
        TrainJob's uid, conditioned on the record's resourceVersion: before any TrainJob carries A."""
        if record is None:
            record = await self._create_record(ident.new_record(tj.job_id, tj.submission, tj.name))
        obj = await self.kube.merge_patch(api.SUBMISSION_RECORDS, record.name,
                                          ident.raise_patch(record, admission, token, tj.name, tj.ref.uid))
        return ident.RecordView.from_obj(obj)

    async def _legacy_floor(self, job_id: str, submission: str) -> int:
        """The highest A the pre-record namespace ledger remembers for a submission (0 if none)."""
        try:
            ledger = await self.kube.get_or_none(api.CONFIGMAPS, ident.LEGACY_LEDGER)
        except Forbidden:
            return 0
        if ledger is None:
            return 0
        data = ledger.get("data")
        value = data.get(ident.legacy_key(job_id, submission)) if isinstance(data, dict) else None
        if value is None:
            return 0
        parsed = parse_count(value)
        if parsed is None:
            raise Refused(f"the old ledger ConfigMap {ident.LEGACY_LEDGER} holds {str(value)[:40]!r} for "
                          f"{job_id}/{submission}, not a number; fix it or run `dispatch admin migrate`",
                          reason="RecordInvalid")
        return parsed

    # ------------------------------------------------------------------ admitting writes

    async def raise_trainjob(self, tj: tr.TrainJobView, admission: int, token: str) -> tr.TrainJobView:
        """A on the TrainJob and in dispatch's runtime patch entry (SSA, conditioned on the RV read)."""
        if not tj.dispatch_object:
            raise Refused(f"trainjob {tj.name} has no dispatch runtime patch; it was not opened by dispatch",
                          reason="NotDispatchObject")
        obj = await self.kube.apply(api.TRAINJOBS, tj.name, tr.raise_body(tj, admission, token))
        return tr.TrainJobView.from_obj(obj)

    async def unsuspend(self, raised: tr.TrainJobView, admission: int, retries: int = 5) -> bool:
        """The write that starts the execution, conditioned on the TrainJob as the raise left it; a 409
        caused only by a status write is retried on the fresh resourceVersion (``_decision``). False: the
        decision no longer holds and the caller decides afresh."""
        current = raised
        for _ in range(retries):
            try:
                await self.kube.merge_patch(api.TRAINJOBS, raised.name, tr.unsuspend_patch(current, admission))
                return True
            except Unreachable as exc:
                if exc.code != 409:
                    raise
            fresh = await self.trainjob_or_none(raised.name)
            if not d.unsuspend_still_holds(raised, fresh, admission):
                return False
            assert fresh is not None
            current = fresh
        return False

    async def suspend(self, tj: tr.TrainJobView) -> None:
        await self.kube.merge_patch(api.TRAINJOBS, tj.name, tr.suspend_patch())

    # ------------------------------------------------------------------ Kueue check writes

    async def write_check(self, workload: kq.Addressed, entry: dict[str, object], *, field_manager: str
                          ) -> None:
        """SSA our one entry of ``status.admissionChecks``, conditioned on the Workload's resourceVersion."""
        await self.kube.apply(api.WORKLOADS, workload.ref.name, kq.check_status_body(workload, entry),
                              workload.ref.namespace, sub="status", field_manager=field_manager, force=True)
