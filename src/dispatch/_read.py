"""The reader: every read the admission protocol and its callers take, in one place.

One consistent-read implementation serves one object, many, and a whole namespace: the object's JobSet
and child Jobs, then the namespace's pods selected two independent ways (dispatch's identity labels, and
JobSet's ``jobset-name``) pinned to one resourceVersion, then the Nodes the pods that may run sit on.
Everything read is parsed once into strict views (``_views``, ``_trainer``, ``_identity``, ``_kueue``);
what to decide from them is ``_decision``'s. The two pod selections are spelled here and nowhere else, and
an admission's inputs are gathered here and nowhere else (``Reader.inputs``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from . import _api as api
from . import _decision as d
from . import _identity as ident
from . import _kueue as kq
from . import _names as n
from . import _trainer as tr
from ._api import Obj
from ._kube import Kube
from ._records import Cessation, JobSpec, State, Status
from ._views import EventView, JobSetView, JobView, NodeView, PodView, labels_of, name_of, parse_count
from .errors import DispatchError, FieldCause, Forbidden, InvalidInput, NotFound, NotServed, Refused, Unreachable

READ_ATTEMPTS = 3
"""A consistent read that meets a compaction (410) is taken again from the start, this often."""

TRAINER_MISSING = "the TrainJob kind is not served: is Kubeflow Trainer installed in this cluster?"


def _in(values: Iterable[str]) -> str:
    return f"({','.join(sorted(set(values)))})"


def by_jobset(names: Collection[str] | None) -> str:
    """JobSet's selection: pods (and Jobs) whose ``jobset-name`` is one of ``names`` (None: any)."""
    return n.JOBSET_NAME_LABEL if names is None else f"{n.JOBSET_NAME_LABEL} in {_in(names)}"


def by_identity(pairs: Collection[tuple[str, str]] | None) -> str | None:
    """dispatch's selection: objects labelled with one of these (job-id, submission) pairs (None: any
    dispatch object). Set-based, so its cost follows the pairs, not the namespace; None when no pair."""
    if pairs is None:
        return n.LABEL_JOB_ID
    if not pairs:
        return None
    return (f"{n.LABEL_JOB_ID} in {_in(j for j, _ in pairs)},"
            f"{n.LABEL_SUBMISSION} in {_in(s for _, s in pairs)}")


async def _none_of() -> dict[tuple[str, str], ident.RecordView | None]:
    return {}


async def _no_workloads() -> list[kq.WorkloadView | None]:
    return []


async def _nothing() -> list[Obj]:
    return []


def not_served(exc: NotFound, what: str) -> NotFound:
    """A kind that is not served names what to install; a missing object stays as it was."""
    return NotServed(what, reason=exc.reason, code=exc.code) if isinstance(exc, NotServed) else exc


def _no_record_kind(exc: NotFound) -> Refused:
    """A missing record kind names what to install; a missing record stays NotFound."""
    if isinstance(exc, NotServed):
        return Refused(f"the {api.SUBMISSION_RECORDS.describe()} kind is not served: dispatch's identity-record "
                       "CRD is not installed (kubectl apply -k deploy/)", reason="NoRecordKind", code=404)
    return exc


@dataclass(frozen=True)
class Target:
    """One object to read: its TrainJob name and its dispatch identity ("" if it has none)."""

    name: str
    job_id: str = ""
    submission: str = ""
    uid: str = ""
    """The TrainJob's uid ("" if unknown, or for a MultiKueue worker's copy, which has its own): a JobSet of
    its name owned by another uid is an earlier TrainJob's, which the rule names with the way to remove it."""

    @staticmethod
    def of(tj: tr.TrainJobView) -> Target:
        return Target(tj.name, tj.job_id, tj.submission, tj.ref.uid)

    @staticmethod
    def remote(tj: tr.TrainJobView) -> Target:
        """The target in a MultiKueue worker, where the TrainJob's copy has another uid than the manager's."""
        return Target(tj.name, tj.job_id, tj.submission)


@dataclass(frozen=True)
class Snapshot:
    """What one consistent read saw of one object's lower layers."""

    jobset: JobSetView | None
    jobs: tuple[JobView, ...]
    pods: tuple[PodView, ...]
    nodes: Mapping[str, NodeView]
    resource_version: str
    kin_jobsets: tuple[JobSetView, ...] = ()
    kin_jobs: tuple[JobView, ...] = ()
    """JobSets and Jobs of the same submission under another TrainJob name (a closed object's, until garbage
    collection removes them): selected by dispatch's identity labels, which its runtime patch entry gives them."""

    def verdict(self, target: Target) -> d.Verdict:
        return d.decide(name=target.name, job_id=target.job_id, submission=target.submission, pods=self.pods,
                        nodes=self.nodes, jobset=self.jobset, jobs=self.jobs, kin_jobsets=self.kin_jobsets,
                        kin_jobs=self.kin_jobs, uid=target.uid)

    def object_pods(self, target: Target) -> list[PodView]:
        return d.object_pods(self.pods, name=target.name, job_id=target.job_id, submission=target.submission)


EMPTY = Snapshot(None, (), (), {}, "")
"""A consistent read not taken (a plain release of an object that runs, has ended or is Kueue's reads none)."""


@dataclass(frozen=True)
class EarlyRead:
    """The lower layers (and the identity record) of one object, read at once with its TrainJob rather than after
    it: valid only for the TrainJob at ``version``, a version some watch had shown before this read began.

    The rule reads a TrainJob before the layers below it, so that a pod made under any later version of it (one
    briefly unsuspended) is in a read that the raise, conditioned on the version read, answers for. A version ``v``
    seen before these reads were sent was the TrainJob's at that moment; if the TrainJob then read with them is still
    at ``v`` (versions never come back), it was at ``v`` all along, so these reads came after ``v`` as the rule's
    order asks, and the raise is conditioned on ``v``. At any other version they are dropped and read again after
    it (``Reader.inputs``)."""

    target: Target
    version: str
    snapshot: Snapshot
    record: ident.RecordView | None
    record_read: bool

    def serves(self, tj: tr.TrainJobView) -> bool:
        """Whether this read may stand for ``tj``'s: the same object at the version seen before it was sent."""
        return EarlyRead.fits(self.target, self.version, tj)

    @staticmethod
    def fits(target: Target, version: str, tj: tr.TrainJobView) -> bool:
        """Whether reads sent for ``target`` at ``version`` may stand for ``tj``'s (known before they answer)."""
        return bool(version) and tj.ref.resource_version == version and Target.of(tj) == target


@dataclass(frozen=True)
class Inputs:
    """Every read one admission decides from (``Reader.inputs``): the TrainJob, the consistent read of its lower
    layers, and, as asked, its identity record, its Kueue Workload and its runtime's replicatedJobs. A ``*_read``
    False means that part was not read (a batch reads records only for the objects found admissible)."""

    trainjob: tr.TrainJobView
    snapshot: Snapshot
    record: ident.RecordView | None = None
    record_read: bool = False
    workload: kq.WorkloadView | None = None
    runtime_jobs: list[str] | None = None
    runtime_read: bool = False
    workers: tuple[str, ...] | None = None
    """Under MultiKueue (read with a ``fleet``, for an object admissible here): the workers Kueue knows."""
    seen: Mapping[str, d.WorkerVerdict] | None = None
    """Under MultiKueue: what each worker that counts (Kueue's, and every one the record remembers) showed."""
    lower_read: bool = True
    """The consistent read was taken (False: only the TrainJob, and its Workload as asked, were read)."""

    @property
    def target(self) -> Target:
        return Target.of(self.trainjob)

    def verdict(self) -> d.Verdict:
        """The rule over this object's part of the consistent read (the local verdict: no worker's); never from
        a read not taken, which would show nothing in the way."""
        if not self.lower_read:
            raise RuntimeError(f"no consistent read was taken for trainjob {self.trainjob.name}: nothing to decide "
                               "from")
        return self.snapshot.verdict(self.target)


class WorkerReads(Protocol):
    """What one MultiKueue worker showed of the objects read (``_fleet.WorkerRead``)."""

    def verdict(self, target: Target) -> d.WorkerVerdict: ...


class FleetReads(Protocol):
    """The MultiKueue workers, read as ``Reader.inputs`` reads them (``_fleet.Fleet``)."""

    async def workers(self) -> Mapping[str, Any]: ...

    async def read(self, namespace: str, targets: Sequence[Target], names: Collection[str],
                   workers: Any = None) -> Mapping[str, WorkerReads]: ...


RecordRead = Literal["all", "admissible", "none"]
"""Which identity records ``Reader.inputs`` reads: every object's, only those the consistent read finds admissible
(after it), or none."""
WorkloadRead = Literal["none", "own", "copy"]
"""Which Workload ``Reader.inputs`` reads: none, the one Kueue made for the TrainJob, or (in a MultiKueue worker)
the one MultiKueue prebuilt for a copy."""


class Reader:
    """The protocol's reads for one namespace (``Core`` holds one and adds the writes)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    @property
    def namespace(self) -> str:
        return self.kube.namespace

    # ------------------------------------------------------------------ the consistent read

    async def read(self, targets: Sequence[Target], *, list_jobsets: bool = False, lower: bool = True,
                   namespace: bool = False) -> dict[str, Snapshot]:
        """One consistent read for one or many objects of the namespace, keyed by TrainJob name.

        JobSets (a get each, sent together, or one list when ``list_jobsets``; in a batch, a get only for those the
        list by the submissions' identity labels did not find), then child Jobs, then the
        pods by dispatch's labels at revision R (a quorum list, paged, RV never resent) and by jobset-name
        pinned to R (resourceVersionMatch=Exact), then the Nodes those pods sit on. Set-based selectors
        make k objects cost about as much as one and no more than their own pods. ``namespace`` selects
        by label key instead of value sets (``find``: one request each whatever the number of objects,
        where a set of thousands of names would not fit a URL) and lists the Nodes once. ``lower=False``
        reads pods and Nodes only (``ceased`` and ``close``). A compaction mid-read (410) reads again.
        """
        for attempt in range(READ_ATTEMPTS):
            try:
                return await self._read(targets, list_jobsets=list_jobsets or namespace, lower=lower,
                                        namespace=namespace)
            except DispatchError as exc:  # 410 Gone: the revision was compacted away
                if exc.code != 410:
                    raise
                if attempt + 1 == READ_ATTEMPTS:
                    raise Unreachable(
                        f"the API server compacted away the revision of a consistent read {READ_ATTEMPTS} times "
                        "in a row; retry", reason="Expired", code=410,
                    ) from exc
        raise AssertionError("unreachable")

    async def inputs(self, trainjobs: Sequence[tr.TrainJobView | str], *, records: RecordRead = "all",
                     workload: WorkloadRead = "none", runtime: bool = False, list_jobsets: bool = False,
                     fleet: FleetReads | None = None, identities: Mapping[str, tuple[str, str] | None] | None = None,
                     lower: bool | Callable[[tr.TrainJobView], bool] = True,
                     early: Mapping[str, EarlyRead] | None = None) -> dict[str, Inputs]:
        """Every read the admissions of ``trainjobs`` decide from, keyed by TrainJob name: the one place their
        inputs are gathered. A TrainJob given by name is read first (the rest are selected by what it says);
        then, at once, the consistent read of them all (``read``), their identity records (``records``: "all",
        one list for many), each one's Workload (``workload``) and the replicatedJobs of each runtime they name
        (``runtime``, once per runtime). None of these depends on another: every write made from them is
        conditioned on the version read, so reading them together changes only the time. A busy controller's
        batch reads records only for the objects the consistent read finds admissible here (``records``:
        "admissible"), after it, in one list. With a ``fleet``, an object MultiKueue dispatches that is admissible
        here has its workers read too (one consistent read per worker for them all: every worker Kueue knows and
        every one its record remembers), for ``_decision.admission_verdict`` to fold in.

        The controller reads its TrainJobs by name as a set (``identities``: the identity each is known by, which
        selects several in one list; ``trainjobs_named``), where a TrainJob that does not exist is left out of the
        answer; and it may read them alone first (``lower=False``: each ``Inputs`` holds only its TrainJob), to
        screen them against their Workloads before it asks for the rest). ``lower`` may also say, per TrainJob,
        whether anything but it and its Workload is read (a release answers an object that runs or has ended from
        those alone); an ``Inputs`` without the rest refuses to give a verdict. ``early`` holds, by TrainJob name,
        lower layers read at once with the TrainJob (``EarlyRead``): used for a TrainJob it serves, in place of
        that object's consistent read and record, else read here as for any other."""
        named = [t for t in trainjobs if isinstance(t, str)]
        got: Mapping[str, tr.TrainJobView | None]
        if identities is not None:
            got = await self.trainjobs_named({name: identities.get(name) for name in named})
        else:
            got = dict(zip(named, await asyncio.gather(*(self.trainjob(name) for name in named)), strict=True))
        views = [t for t in (got[t] if isinstance(t, str) else t for t in trainjobs) if t is not None]
        if lower is False:
            return {t.name: Inputs(t, EMPTY, lower_read=False) for t in views}
        deep = {t.name for t in views if lower is True or lower(t)}
        served = {t.name: ahead for t in views if t.name in deep and early is not None
                  and (ahead := early.get(t.name)) is not None and ahead.serves(t)
                  and (ahead.record_read or records != "all")}
        pairs = [(t.job_id, t.submission) for t in views if t.job_id and t.submission and t.name in deep
                 and t.name not in served]
        runtimes = {(t.runtime_kind, t.runtime_name): t for t in views if t.name in deep} if runtime else {}
        snaps, recs, workloads, jobs = await asyncio.gather(
            self.read([Target.of(t) for t in views if t.name in deep and t.name not in served],
                      list_jobsets=list_jobsets),
            self.records(pairs) if records == "all" and pairs else _none_of(),
            asyncio.gather(*(self.copy_workload(t) if workload == "copy" else self.workload_of(t)
                             for t in views)) if workload != "none" else _no_workloads(),
            asyncio.gather(*(self.runtime_jobs_of(t) for t in runtimes.values())))
        by_runtime = dict(zip(runtimes, jobs, strict=True))
        out: dict[str, Inputs] = {}
        for i, t in enumerate(views):
            read = t.name in deep
            if (used := served.get(t.name)) is not None:
                snap, rec, rec_read = used.snapshot, used.record, used.record_read
            else:
                snap, rec, rec_read = (snaps[t.name] if read else EMPTY, recs.get((t.job_id, t.submission)),
                                       records == "all" and read)
            out[t.name] = Inputs(
                t, snap, rec, rec_read, workloads[i] if workload != "none" else None,
                by_runtime.get((t.runtime_kind, t.runtime_name)), runtime and read, lower_read=read)
        if records == "admissible":
            chosen = [one for one in out.values() if one.lower_read and not one.record_read
                      and one.verdict().admissible]
            found = await self.records((one.trainjob.job_id, one.trainjob.submission) for one in chosen
                                       if one.trainjob.dispatch_object)
            for one in chosen:
                key = (one.trainjob.job_id, one.trainjob.submission)
                out[one.trainjob.name] = replace(one, record=found.get(key), record_read=True)
        if fleet is not None:
            await self._across(fleet, out)
        return out

    async def _across(self, fleet: FleetReads, out: dict[str, Inputs]) -> None:
        """The workers' part of the inputs of the objects MultiKueue dispatches that are admissible here."""
        cases = [one for one in out.values() if one.trainjob.dispatch_object and one.lower_read
                 and one.trainjob.managed_by == n.MULTIKUEUE and one.verdict().admissible]
        if not cases:
            return
        workers = await fleet.workers()
        names: set[str] = set(workers)
        for one in cases:
            names.update(one.record.clusters if one.record is not None else ())
        reads = await fleet.read(self.namespace, [one.target for one in cases], names, workers)
        for one in cases:
            out[one.trainjob.name] = replace(one, workers=tuple(sorted(workers)), seen={
                name: r.verdict(replace(one.target, uid="")) for name, r in reads.items()})

    async def early(self, target: Target, version: str, *, records: bool) -> EarlyRead:
        """``target``'s consistent read (and its identity record, with ``records``) for the TrainJob at ``version``,
        sent before that TrainJob is read: see ``EarlyRead`` for when ``inputs`` may use it."""
        pair = (target.job_id, target.submission)
        snaps, recs = await asyncio.gather(
            self.read([target]), self.records([pair]) if records and all(pair) else _none_of())
        return EarlyRead(target, version, snaps[target.name], recs.get(pair), records)

    async def read_one(self, target: Target, *, lower: bool = True) -> Snapshot:
        return (await self.read([target], lower=lower))[target.name]

    async def _read(self, targets: Sequence[Target], *, list_jobsets: bool, lower: bool, namespace: bool
                    ) -> dict[str, Snapshot]:
        names = sorted({t.name for t in targets})
        if not names:
            return {}
        scope = None if namespace else names
        identity = by_identity(None if namespace else {(t.job_id, t.submission) for t in targets
                                                       if t.job_id and t.submission})
        jobsets: dict[str, JobSetView | None] = {}
        jobs: list[JobView] = []
        kin_sets: list[JobSetView] = []
        if lower:
            if list_jobsets:
                every = [JobSetView.from_obj(j) for j in await self._list_or_empty(api.JOBSETS)]
                listed = {j.name: j for j in every}
                jobsets = {name: listed.get(name) for name in names}
                kin_sets = [j for j in every if j.job_id]
                named, by_ident_jobs = await asyncio.gather(
                    self._list_or_empty(api.JOBS, by_jobset(scope)),
                    self._list_or_empty(api.JOBS, identity) if identity and scope is not None else _nothing())
                jobs = [JobView.from_obj(j) for j in {name_of(j): j for j in [*named, *by_ident_jobs]}.values()]
            else:  # one get each, sent together: the reads' latencies overlap, their order does not matter
                # the submission's layers under any name too (item 2 of issue 25: a closed object's JobSet and
                # Jobs until garbage collection reaches them), by the identity labels dispatch's entry gives them.
                # In a batch, a JobSet that list found (a dispatch object's, which carries them) is not got again:
                # it is the object its name names, read as freshly and still before the pods; the others are got
                # after it (issue 37: each JobSet of a batch was read twice, a request each time). Alone, the get
                # goes with the list, as one round trip.
                together = len(names) == 1 or not identity
                got, by_ident_sets, named, by_ident_jobs = await asyncio.gather(
                    self._jobsets_got(names if together else []),
                    self._list_or_empty(api.JOBSETS, identity) if identity else _nothing(),
                    self._list_or_empty(api.JOBS, by_jobset(scope)),
                    self._list_or_empty(api.JOBS, identity) if identity else _nothing())
                kin_sets = [JobSetView.from_obj(o) for o in by_ident_sets]
                if together:
                    jobsets = {name: JobSetView.from_obj(o) if o is not None else None
                               for name, o in zip(names, got, strict=True)}
                else:
                    listed = {j.name: j for j in kin_sets}
                    rest = [name for name in names if name not in listed]
                    more = await self._jobsets_got(rest)
                    jobsets = {name: listed.get(name) for name in names}
                    jobsets.update((name, JobSetView.from_obj(o) if o is not None else None)
                                   for name, o in zip(rest, more, strict=True))
                seen_jobs = {name_of(j): j for j in [*named, *by_ident_jobs]}
                jobs = [JobView.from_obj(j) for j in seen_jobs.values()]
        if identity is not None:
            first = await self.kube.list(api.PODS, labels=identity)
            second = await self.kube.list(api.PODS, labels=by_jobset(scope),
                                          resource_version=first.resource_version, exact=True)
            raw, rv = first.items + second.items, first.resource_version
        else:
            only = await self.kube.list(api.PODS, labels=by_jobset(scope))
            raw, rv = only.items, only.resource_version
        pods = [PodView.from_obj(p) for p in raw]
        nodes = await (self.listed_nodes(pods) if namespace else self.nodes(pods))
        by_name: dict[str, list[PodView]] = {}
        by_ident: dict[tuple[str, str], list[PodView]] = {}
        for pod in pods:  # index once: each object then takes its own pods in O(its pods)
            by_name.setdefault(pod.jobset_name, []).append(pod)
            if pod.job_id:
                by_ident.setdefault((pod.job_id, pod.submission), []).append(pod)
        jobs_of: dict[str, list[JobView]] = {}
        kin_jobs_of: dict[tuple[str, str], list[JobView]] = {}
        for job in jobs:
            jobs_of.setdefault(job.jobset_name, []).append(job)
            if job.job_id:
                kin_jobs_of.setdefault((job.job_id, job.submission), []).append(job)
        kin_sets_of: dict[tuple[str, str], list[JobSetView]] = {}
        for js in kin_sets:
            kin_sets_of.setdefault((js.job_id, js.submission), []).append(js)
        out: dict[str, Snapshot] = {}
        for t in targets:
            mine = by_name.get(t.name, []) + (by_ident.get((t.job_id, t.submission), []) if t.job_id else [])
            key = (t.job_id, t.submission)
            out[t.name] = Snapshot(
                jobsets.get(t.name), tuple(jobs_of.get(t.name, [])), tuple(mine), nodes, rv,
                kin_jobsets=tuple(js for js in kin_sets_of.get(key, []) if js.name != t.name) if t.job_id else (),
                kin_jobs=tuple(j for j in kin_jobs_of.get(key, []) if j.jobset_name != t.name) if t.job_id else ())
        return out

    async def _jobsets_got(self, names: Sequence[str]) -> list[Obj | None]:
        """A get of each JobSet, sent together (None for one that does not exist)."""
        return list(await asyncio.gather(*(self.kube.get_or_none(api.JOBSETS, name) for name in names)))

    async def submission_pods(self, job_id: str, submission: str, *, deleting_nodes: bool = False,
                              ) -> tuple[list[PodView], dict[str, NodeView]]:
        """One submission's pods by dispatch's selection (one quorum list) and the Nodes of those that may run:
        what the guard's review of a pod create reads (``_decision.pod_start_problem``). ``deleting_nodes``:
        only the Nodes of pods being deleted (what status of a running object needs, without a GET per rank)."""
        return await self.submissions_pods([(job_id, submission)], deleting_nodes=deleting_nodes)

    async def submissions_pods(self, pairs: Collection[tuple[str, str]], *, deleting_nodes: bool = False,
                               ) -> tuple[list[PodView], dict[str, NodeView]]:
        """``submission_pods`` of several submissions with one list (``find`` of running objects); the set-based
        selection may also match a crossed pair (one's job-id, another's submission): callers group by pair."""
        selector = by_identity(pairs)
        pods = [PodView.from_obj(p) for p in (await self.kube.list(api.PODS, labels=selector)).items] \
            if selector else []
        return pods, await self.nodes([p for p in pods if p.deleting] if deleting_nodes else pods)

    async def runtime_jobs_of(self, tj: tr.TrainJobView) -> list[str] | None:
        """The replicatedJobs of the runtime a TrainJob names, as it is now (None: it cannot be read, so
        dispatch's entry is left as it is; Trainer cannot build a JobSet from a missing runtime either)."""
        return (await self.runtime_of(tj))[0]

    async def runtime_of(self, tj: tr.TrainJobView) -> tuple[list[str] | None, bool]:
        """``runtime_jobs_of``, and whether the runtime is gone (NotFound, not merely unreadable): status
        says so, as Trainer's webhook then refuses every change to the TrainJob."""
        if not tj.runtime_name:
            return None, False
        res = api.CLUSTER_RUNTIMES if tj.runtime_kind == "ClusterTrainingRuntime" else api.RUNTIMES
        try:
            return tr.runtime_jobs(await self.kube.get(res, tj.runtime_name)) or None, False
        except NotFound:
            return None, True
        except Forbidden:
            return None, False

    async def jobsets(self, names: Collection[str]) -> dict[str, JobSetView]:
        """The JobSets of these objects (one GET for one, one LIST for more; none where the kind is not
        served), so status can tell a running object whose JobSet never started."""
        if not names:
            return {}
        if len(names) == 1:
            got = [j for j in [await self._get_or_none(api.JOBSETS, next(iter(names)))] if j is not None]
        else:
            got = await self._list_or_empty(api.JOBSETS)
        return {v.name: v for v in map(JobSetView.from_obj, got) if v.name in names}

    async def _get_or_none(self, res: api.Res, name: str) -> Obj | None:
        try:
            return await self.kube.get_or_none(res, name)
        except NotFound:  # the kind is not served
            return None

    async def jobs_of(self, name: str) -> list[JobView]:
        """The child Jobs of one JobSet (none where the Job kind cannot be read as such)."""
        return [JobView.from_obj(j) for j in await self._list_or_empty(api.JOBS, by_jobset([name]))]

    async def build_failures(self, tj: tr.TrainJobView) -> list[EventView]:
        """Trainer's Warning Events that it could not build this TrainJob's JobSet (by the TrainJob's uid, so
        an earlier TrainJob of the name is not read), read only when status finds no JobSet for a dispatch
        object. A role without ``list`` on Events (an install before this read) reads none: status then says
        less, never fails."""
        if not tj.ref.uid or not tj.dispatch_object or tj.managed_by == n.MULTIKUEUE:
            return []
        pages = self.kube.pages(api.EVENTS, fields=f"involvedObject.uid={tj.ref.uid},reason={d.BUILD_FAILED}",
                                limit=50)
        try:
            first = await anext(pages, None)   # one page of at most 50: the recorders aggregate repeats
        except (NotFound, Forbidden):
            return []
        finally:
            await pages.aclose()
        return [EventView.from_obj(e) for e in (first.items if first is not None else [])[:50]]

    async def _list_or_empty(self, res: api.Res, labels: str | None = None) -> list[Obj]:
        try:
            return (await self.kube.list(res, labels=labels)).items
        except NotFound:
            return []

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

    # ------------------------------------------------------------------ TrainJobs, runtimes, Workloads

    async def trainjob(self, name: str) -> tr.TrainJobView:
        try:
            return tr.TrainJobView.from_obj(await self.kube.get(api.TRAINJOBS, name))
        except NotFound as exc:
            raise NotFound(
                f"trainjob {name} not found in namespace {self.namespace}"
                + (" (is Kubeflow Trainer installed?)" if isinstance(exc, NotServed) else ""),
                reason=exc.reason, code=exc.code,
            ) from exc

    async def trainjob_or_none(self, name: str) -> tr.TrainJobView | None:
        obj = await self.kube.get_or_none(api.TRAINJOBS, name)
        return tr.TrainJobView.from_obj(obj) if obj is not None else None

    async def trainjobs(self, selector: str | None) -> list[tr.TrainJobView]:
        try:
            listed = (await self.kube.list(api.TRAINJOBS, labels=selector)).items
        except NotFound as exc:
            raise not_served(exc, TRAINER_MISSING) from exc
        return [tr.TrainJobView.from_obj(t) for t in listed]

    async def live_trainjob_of(self, job_id: str, submission: str) -> tr.TrainJobView | None:
        """A TrainJob of the submission that is not being deleted (any name)."""
        live = [v for v in await self.trainjobs(by_identity([(job_id, submission)])) if not v.deleting]
        return live[0] if live else None

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

    async def runtime_shape(self, spec: JobSpec) -> tuple[tr.RuntimeShape, tuple[str, ...]]:
        """The runtime's ``RuntimeShape`` (its jobs, containers, volumes and mounts) and its warnings: its Jobs
        replace deleting pods at once (Trainer's runtime patches cannot set podReplacementPolicy, so dispatch
        can only say so); its containers restart whatever the pod's restart policy says."""
        res = api.CLUSTER_RUNTIMES if spec.runtime_kind == "ClusterTrainingRuntime" else api.RUNTIMES
        try:
            runtime = await self.kube.get(res, spec.runtime)
        except NotServed as exc:
            raise not_served(exc, TRAINER_MISSING) from exc
        except NotFound as exc:
            raise NotFound(
                f"{spec.runtime_kind} {spec.runtime} not found"
                + (" in namespace " + self.namespace if res.namespaced else ""),
                reason=exc.reason, code=exc.code, causes=[FieldCause("runtime", "not found", "NotFound")],
            ) from exc
        shape = tr.runtime_shape(runtime)
        if not shape.jobs:
            raise InvalidInput(f"{spec.runtime_kind} {spec.runtime} has no replicatedJobs", reason="Invalid")
        parallel = tr.runtime_nonindexed(runtime, spec.num_nodes)
        unindexed = d.nonindexed_text(f"{spec.runtime_kind} {spec.runtime}", parallel)
        if unindexed:
            raise InvalidInput(unindexed, reason="Invalid", causes=[FieldCause(
                "runtime", f"a NonIndexed Job with parallelism above 1 ({', '.join(sorted(parallel))})",
                "FieldValueNotSupported")])
        warnings = (d.runtime_replacement_warning(spec.runtime_kind, spec.runtime,
                                                  tr.runtime_replacement_policies(runtime)),
                    d.runtime_restarts_warning(spec.runtime_kind, spec.runtime, tr.runtime_container_restarts(runtime)))
        return shape, tuple(w for w in warnings if w)

    async def runtime_or_none(self, kind: str, name: str) -> Obj | None:
        """The (Cluster)TrainingRuntime ``kind``/``name`` as served, or None if it does not exist (what
        enrolment's ``enrol`` takes); a cluster without Trainer is named."""
        res = api.CLUSTER_RUNTIMES if kind == "ClusterTrainingRuntime" else api.RUNTIMES
        try:
            return await self.kube.get(res, name)
        except NotServed as exc:
            raise not_served(exc, TRAINER_MISSING) from exc
        except NotFound:
            return None

    async def workloads_named(self, names: Sequence[str], owner_uids: Collection[str] = ()) -> dict[str, Obj | None]:
        """The Workloads ``names``, fresh: several are listed by their owners' uids (``owner_uids``, one set-based
        list), and whatever the list misses is got by name; None for one that does not exist."""
        found: dict[str, Obj | None] = {}
        uids = sorted({uid for uid in owner_uids if uid and n.label_value_problem(uid) is None})
        if uids and len(names) > 1:
            wanted = set(names)
            for w in (await self.kube.list(api.WORKLOADS, labels=kq.uid_selector(uids))).items:
                name = name_of(w)   # its name alone: the caller parses the Workloads it keeps
                if name in wanted:
                    found[name] = w
        missing = [name for name in names if name not in found]
        got = await asyncio.gather(*(self.kube.get_or_none(api.WORKLOADS, name) for name in missing))
        found.update(zip(missing, got, strict=True))
        return found

    async def workload_or_none(self, name: str) -> kq.WorkloadView | None:
        obj = await self.kube.get_or_none(api.WORKLOADS, name)
        return kq.WorkloadView.from_obj(obj) if obj is not None else None

    async def trainjobs_named(self, wanted: Mapping[str, tuple[str, str] | None]) -> dict[str, tr.TrainJobView | None]:
        """The TrainJobs named in ``wanted`` (name -> the identity Kueue copied into its pod sets, if
        known): several are listed by those identity labels, one set-based list, and whatever the list
        misses (no identity, or labels edited) is got by name; None for one that does not exist."""
        idents = {i for i in wanted.values() if i is not None}
        found: dict[str, tr.TrainJobView | None] = {}
        if idents and len(wanted) > 1:
            pairs = {(i, s) for i, s in idents if i and s}
            for view in await self.trainjobs(by_identity(pairs)) if pairs else []:
                if view.name in wanted:
                    found[view.name] = view
        unlisted = sorted(set(wanted) - set(found))
        got = await asyncio.gather(*(self.trainjob_or_none(name) for name in unlisted))
        found.update(zip(unlisted, got, strict=True))
        return found

    async def listed_trainjobs(self, labels: str | None, *, all_namespaces: bool = False) -> list[Obj]:
        """The TrainJobs ``labels`` selects, as served, in this namespace or (``all_namespaces``) every one."""
        return (await self.kube.list(api.TRAINJOBS, labels=labels, all_namespaces=all_namespaces)).items

    async def pod_or_none(self, name: str) -> Obj | None:
        """One pod as served, or None."""
        return await self.kube.get_or_none(api.PODS, name)

    async def jobset_pods(self, name: str) -> list[Obj]:
        """The pods of the JobSet ``name`` (its ``jobset-name`` selection), as served."""
        return (await self.kube.list(api.PODS, labels=by_jobset([name]))).items

    async def workload_of(self, tj: tr.TrainJobView) -> kq.WorkloadView | None:
        """The Kueue Workload that owns the TrainJob's admission, if Kueue manages it (label or not)."""
        if not tj.ref.uid:
            return None
        try:
            found = await self.kube.list(api.WORKLOADS, labels=kq.uid_selector([tj.ref.uid]))
        except NotFound:
            return None  # Kueue is not installed
        return kq.WorkloadView.from_obj(found.items[0]) if found.items else None

    async def copy_workload(self, tj: tr.TrainJobView) -> kq.WorkloadView | None:
        """In a MultiKueue worker, the Workload a copy is admitted through: the one MultiKueue prebuilt (named
        by the copy's label or annotation), once the worker's Kueue made the copy its owner."""
        name = tj.labels.get(n.PREBUILT_WORKLOAD_LABEL) or tj.prebuilt_workload
        if not name or not tj.ref.uid:
            return None
        try:
            obj = await self.kube.get_or_none(api.WORKLOADS, name)
        except NotFound:
            return None  # Kueue is not installed
        if obj is None:
            return None
        view = kq.WorkloadView.from_obj(obj)
        return view if view.owner is not None and view.owner.uid == tj.ref.uid else None

    async def workloads_by_owner(self) -> dict[str, kq.WorkloadView]:
        """Every Workload of the namespace by its owner's uid (empty where Kueue is not installed)."""
        out: dict[str, kq.WorkloadView] = {}
        for w in await self._list_or_empty(api.WORKLOADS):
            uid = labels_of(w).get(n.KUEUE_JOB_UID_LABEL)
            if uid:
                out[uid] = kq.WorkloadView.from_obj(w)
        return out

    async def our_checks(self, controller_name: str = n.CONTROLLER_NAME) -> set[str] | None:
        """Names of the AdmissionChecks owned by ``controller_name``; None if they cannot be listed."""
        try:
            return kq.checks_owned((await self.kube.list(api.ADMISSION_CHECKS)).items, controller_name)
        except (NotFound, Forbidden):
            return None

    # ------------------------------------------------------------------ the identity record

    async def record(self, job_id: str, submission: str) -> ident.RecordView | None:
        try:
            obj = await self.kube.get(api.SUBMISSION_RECORDS, ident.record_name(job_id, submission))
        except NotServed as exc:
            raise _no_record_kind(exc) from exc
        except NotFound:
            return None
        return ident.RecordView.from_obj(obj)

    async def floor_obj(self, job_id: str, submission: str) -> Obj | None:
        """The submission's cluster-scoped floor of A as stored (None if it has none)."""
        try:
            return await self.kube.get_or_none(api.SUBMISSION_FLOORS,
                                               ident.floor_name(self.kube.namespace, job_id, submission))
        except NotServed as exc:
            raise Refused(f"the {api.SUBMISSION_FLOORS.describe()} kind is not served: dispatch's floor CRD is "
                          "not installed (kubectl apply -k deploy/)", reason="NoRecordKind", code=404) from exc

    async def floor(self, job_id: str, submission: str) -> int:
        """The highest A ever issued to the submission in this namespace, as its floor remembers it: what
        a record created again (its namespace deleted and re-created) continues from. 0 without a floor."""
        obj = await self.floor_obj(job_id, submission)
        try:
            return ident.floor_admission(obj, self.kube.namespace, job_id, submission)
        except ValueError as exc:
            raise Refused(f"{exc}; an admin fixes or deletes it", reason="RecordInvalid") from exc

    async def records(self, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], ident.RecordView | None]:
        """The records of many submissions: one list by their labels (set-based, so its cost follows
        these submissions, not the namespace), each checked against its hashed name; one get for one."""
        keys = sorted(set(pairs))
        if len(keys) < 2:
            return {key: await self.record(*key) for key in keys}
        listed = await self._records(by_identity(keys))
        by_name = {v.name: v for v in listed}
        out: dict[tuple[str, str], ident.RecordView | None] = {}
        for key in keys:
            found = by_name.get(ident.record_name(*key))
            # a record whose labels were edited away is not missing: a get by its name decides
            out[key] = found if found is not None else await self.record(*key)
        return out

    async def claims_of(self, trainjob: str) -> list[ident.RecordView]:
        """Records held by ``trainjob`` (by their holder label): a claim whose TrainJob may not exist."""
        found = await self._records(f"{ident.LABEL_HOLDER}={trainjob}")
        return [r for r in found if r.trainjob == trainjob]

    async def _records(self, selector: str | None) -> list[ident.RecordView]:
        try:
            found = await self.kube.list(api.SUBMISSION_RECORDS, labels=selector)
        except NotFound as exc:
            raise _no_record_kind(exc) from exc
        return [ident.RecordView.from_obj(o) for o in found.items]

    async def legacy_ledger(self) -> Obj | None:
        """The pre-record namespace ledger, if it is still there (None where it cannot be read)."""
        try:
            return await self.kube.get_or_none(api.CONFIGMAPS, ident.LEGACY_LEDGER)
        except Forbidden:
            return None

    async def legacy_floor(self, job_id: str, submission: str) -> int:
        """The highest A the pre-record namespace ledger remembers for a submission (0 if none)."""
        ledger = await self.legacy_ledger()
        data = ledger.get("data") if ledger is not None else None
        value = data.get(ident.legacy_key(job_id, submission)) if isinstance(data, dict) else None
        if value is None:
            return 0
        parsed = parse_count(value)
        if parsed is None:
            raise Refused(f"the old ledger ConfigMap {ident.LEGACY_LEDGER} holds {str(value)[:40]!r} for "
                          f"{job_id}/{submission}, not a number; fix it or run `dispatch admin migrate`",
                          reason="RecordInvalid")
        return parsed


    # ------------------------------------------------------------------ status (``inspect``, ``find``)

    def status_of(self, tj: tr.TrainJobView, verdict: d.Verdict | None, check: kq.CheckEntry | None = None,
                note: str = "", *, kueue: bool | None = None, warnings: Sequence[str | None] = (),
                record: ident.RecordView | None = None, workload: kq.WorkloadView | None = None,
                stalled: str | None = None) -> Status:
        managed = bool(tj.queue) if kueue is None else kueue
        return Status(
            name=tj.name,
            namespace=tj.ref.namespace or self.namespace,
            state=tj.state,
            identity=tj.identity,
            cause=d.explain(tj, verdict, check, note, record, stalled),
            mode="kueue" if managed else "plain",
            queue=tj.queue,
            created=tj.created,
            remaining=verdict.remaining if verdict else (),
            resource_version=tj.ref.resource_version,
            managed=tj.labelled,
            created_by=tj.created_by,
            warnings=tuple(w for w in warnings if w),
            cluster=workload.cluster_name if workload is not None else "",
        )

    def keeper_idle(self, pods: Sequence[PodView], nodes: Mapping[str, NodeView]) -> str | None:
        """Whether ended pods wait for a controller that is not freeing them, on the API server's own clock
        (the Date of its last answer, the clock its deletion times are on); no answer dated, no warning."""
        now = self.kube.server_time
        return d.keeper_idle_warning(pods, nodes, now) if now is not None else None

    async def status(self, name: str) -> Status:
        """``inspect``: the object's state, identity and cause; a not-running object names what keeps it waiting."""
        tj = await self.trainjob(name)
        runtime_jobs, runtime_gone = await self.runtime_of(tj)
        gap = [d.uncovered_warning(tj, runtime_jobs), d.runtime_missing_warning(tj, runtime_gone)]
        if tj.state is State.RUNNING:
            # under MultiKueue the Workload says which worker runs it (the manager has no pods of it)
            running_in = await self.workload_of(tj) if tj.managed_by == n.MULTIKUEUE else None
            jobset = (await self.jobsets([name])).get(name) if tj.dispatch_object else None
            # a rank whose new pod the guard refuses while the pod before it may still run (a deleted Job)
            pods, nodes = (await self.submission_pods(tj.job_id, tj.submission, deleting_nodes=True)
                           if tj.labelled and tj.managed_by != n.MULTIKUEUE else ([], {}))
            jobs = await self.jobs_of(name)
            # layers an earlier TrainJob or JobSet of the name left: Trainer or JobSet cannot build this one's
            unbuilt = d.unbuilt_text(tj, await self.build_failures(tj)) if jobset is None else None
            # a NonIndexed Job's other pods are refused by the guard while one runs: say why
            stalled = [d.stalled_jobset_text(tj, jobset, runtime_jobs), unbuilt, d.orphaned_jobs_text(jobset, jobs),
                       d.waiting_ranks_text(tj, pods, nodes),
                       d.nonindexed_text(f"trainjob {name}", d.jobs_nonindexed(jobs, name), running=True)]
            return self.status_of(tj, None, warnings=[d.jobs_replacement_warning(jobs, name), *gap,
                                                    self.keeper_idle(pods, nodes)],
                                workload=running_in, stalled="; ".join(filter(None, stalled)) or None)
        snap = await self.read_one(Target.of(tj))
        verdict = snap.verdict(Target.of(tj))
        workload = await self.workload_of(tj)  # Kueue may manage it without the queue-name label
        record = (await self.status_records([(tj.job_id, tj.submission)])).get((tj.job_id, tj.submission))
        check = None
        if workload is not None:
            check = kq.check_of(workload, await self.our_checks())
        return self.status_of(tj, verdict, check, d.workload_note(workload, tj),
                            kueue=workload is not None or bool(tj.queue),
                            warnings=[d.jobs_replacement_warning(snap.jobs, name), *gap,
                                      d.nonindexed_text(f"trainjob {name} cannot start",
                                                        d.jobs_nonindexed(snap.jobs, name)),
                                      self.keeper_idle(snap.object_pods(Target.of(tj)), snap.nodes)],
                            record=record, workload=workload,
                            # an end Trainer copied from an earlier TrainJob's JobSet says all: nothing of this
                            # one is built again (and an earlier refusal to build it no longer matters)
                            stalled=d.copied_end_text(tj, snap.jobset) or "; ".join(filter(None, [
                                d.stalled_jobset_text(tj, snap.jobset, runtime_jobs),
                                d.unbuilt_text(tj, await self.build_failures(tj)) if snap.jobset is None else None,
                                d.orphaned_jobs_text(snap.jobset, snap.jobs)])) or None)

    async def statuses(self, listed: list[Obj], state: State | Collection[State] | None) -> list[Status]:
        """``find``'s statuses of the TrainJobs listed in this reader's namespace."""
        trainjobs = [tr.TrainJobView.from_obj(t) for t in listed]
        if state is not None:
            wanted = {state} if isinstance(state, State) else set(state)
            trainjobs = [t for t in trainjobs if t.state in wanted]
        idle = [t for t in trainjobs if t.state is not State.RUNNING]
        refs = sorted({(t.runtime_kind, t.runtime_name) for t in trainjobs if t.dispatch_object})
        got = await asyncio.gather(*(self.runtime_of(next(t for t in trainjobs
                                                               if (t.runtime_kind, t.runtime_name) == ref))
                                     for ref in refs))
        runtimes = dict(zip(refs, got, strict=True))
        running = [t.name for t in trainjobs if t.state is State.RUNNING and t.dispatch_object]
        jobsets = await self.jobsets(running)
        # a rank whose new pod the guard refuses while the pod before it may still run: one pod list for them all
        here = {(t.job_id, t.submission) for t in trainjobs
                if t.state is State.RUNNING and t.labelled and t.managed_by != n.MULTIKUEUE}
        ranked, ranked_nodes = await self.submissions_pods(sorted(here), deleting_nodes=True)

        def runtime_jobs(t: tr.TrainJobView) -> list[str] | None:
            return runtimes.get((t.runtime_kind, t.runtime_name), (None, False))[0]

        def gap(t: tr.TrainJobView) -> list[str | None]:
            jobs, gone = runtimes.get((t.runtime_kind, t.runtime_name), (None, False))
            return [d.uncovered_warning(t, jobs), d.runtime_missing_warning(t, gone)]

        def run(t: tr.TrainJobView, workload: kq.WorkloadView | None = None) -> Status:
            mine = [p for p in ranked if (p.job_id, p.submission) == (t.job_id, t.submission)]
            stalled = [d.stalled_jobset_text(t, jobsets.get(t.name), runtime_jobs(t)),
                       d.waiting_ranks_text(t, mine, ranked_nodes) if (t.job_id, t.submission) in here else None]
            return self.status_of(t, None, warnings=gap(t), workload=workload,
                                stalled="; ".join(filter(None, stalled)) or None)
        fleet = any(t.managed_by == n.MULTIKUEUE for t in trainjobs)
        if not idle and not fleet:
            return sorted((run(t) for t in trainjobs), key=lambda s: s.name)
        # Kueue may manage an object without the queue-name label: its Workload says so (and, under
        # MultiKueue, which worker runs it)
        workloads = await self.workloads_by_owner()
        if not idle:
            return sorted((run(t, workloads.get(t.ref.uid)) for t in trainjobs), key=lambda s: s.name)
        snaps = await self.read([Target.of(t) for t in idle], namespace=True)
        records = await self.status_records([(t.job_id, t.submission) for t in idle if t.labelled])
        ours = await self.our_checks()
        out: list[Status] = []
        for t in trainjobs:
            if t.state is State.RUNNING:
                out.append(run(t, workloads.get(t.ref.uid)))
                continue
            snap = snaps[t.name]
            wl = workloads.get(t.ref.uid)
            out.append(self.status_of(t, snap.verdict(Target.of(t)), kq.check_of(wl, ours) if wl else None,
                                    d.workload_note(wl, t), kueue=wl is not None or bool(t.queue),
                                    warnings=[d.jobs_replacement_warning(snap.jobs, t.name), *gap(t)],
                                    record=records.get((t.job_id, t.submission)), workload=wl,
                                    stalled="; ".join(filter(None, [
                                        d.copied_end_text(t, snap.jobset),
                                        d.stalled_jobset_text(t, snap.jobset, runtime_jobs(t))])) or None))
        return sorted(out, key=lambda s: s.name)

    async def status_records(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], ident.RecordView | None]:
        """Status's records (whether a close was interrupted): none where they cannot be read, as status
        reads without them otherwise."""
        try:
            return await self.records([p for p in pairs if p[0] and p[1]])
        except (Refused, Forbidden):
            return {}

    async def cessation(self, name: str) -> tuple[tr.TrainJobView | None, d.Verdict, Cessation]:
        """``ceased`` in this cluster: the TrainJob (None if gone), the rule's verdict and whether the object's
        processes are proven gone here (under MultiKueue the workers are read after, ``_fleet.ceased_across``)."""
        tj = await self.trainjob_or_none(name)
        target = Target.of(tj) if tj is not None else Target(name)
        snap = await self.read_one(target)
        here = d.cessation(trainjob=tj, name=name, job_id=target.job_id, submission=target.submission,
                           pods=snap.pods, nodes=snap.nodes, jobset=snap.jobset, jobs=snap.jobs,
                           kin_jobsets=snap.kin_jobsets, kin_jobs=snap.kin_jobs)
        return tj, snap.verdict(target), here


class Readers:
    """One ``Reader`` per namespace, made on first use: the controller's parts that only read (the guard) or
    read before writing pods alone (the finalizer keeper) serve every namespace through one API client."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self._made: dict[str, Reader] = {}

    def __call__(self, namespace: str) -> Reader:
        found = self._made.get(namespace)
        if found is None:
            found = self._made[namespace] = Reader(self._kube.in_namespace(namespace))
        return found
