"""The adapter: open, release, hold, inspect, find, ceased, close, wait, logs.

``AsyncAdapter`` is the core; ``Adapter`` is a synchronous facade that runs the same core on a private
event loop thread (as lightkube pairs ``Client`` with ``AsyncClient``). Reads go through one
consistent snapshot per decision; every admitting write is conditioned on the resourceVersion read.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx2

from . import _decision as d
from . import _kube as k
from . import _names as n
from ._records import Cessation, Identity, JobSpec, RemainingPod, State, Status
from ._validate import validate_spec as validate_spec
from .errors import (
    FieldCause,
    Forbidden,
    InvalidInput,
    NotFound,
    PodsRemain,
    ReadOnly,
    Refused,
    Unreachable,
)

T = TypeVar("T")
Obj = dict[str, Any]


@dataclass
class Snapshot:
    """What one consistent read saw of an object's lower layers."""

    jobset: Obj | None
    jobs: list[Obj]
    pods: list[Obj]
    nodes: dict[str, d.NodeView]
    resource_version: str


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


class AsyncAdapter:
    """The dispatch adapter for one namespace. A writer may admit; a read-only adapter only reads."""

    def __init__(self, kube: k.Kube, *, read_only: bool = False, conflict_retries: int = 5) -> None:
        self._kube = kube
        self.read_only = read_only
        self.conflict_retries = conflict_retries

    @classmethod
    def connect(
        cls,
        namespace: str | None = None,
        *,
        kubeconfig: str | Path | None = None,
        context: str | None = None,
        read_only: bool = False,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> AsyncAdapter:
        """Connect with a kubeconfig (default: KUBECONFIG, ~/.kube/config, then in-cluster)."""
        if namespace is not None:
            problem = n.dns1123_subdomain_problem(namespace)
            if problem:
                n.check([FieldCause("namespace", f"{namespace!r} {problem}", "FieldValueInvalid")])
        kube = k.Kube.connect(namespace=namespace, kubeconfig=kubeconfig, context=context, transport=transport)
        return cls(kube, read_only=read_only)

    @property
    def namespace(self) -> str:
        return self._kube.namespace

    @property
    def kube(self) -> k.Kube:
        """The API access this adapter uses (request counters are read by benchmarks)."""
        return self._kube

    async def aclose(self) -> None:
        await self._kube.aclose()

    async def __aenter__(self) -> AsyncAdapter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _writer(self, verb: str) -> None:
        if self.read_only:
            raise ReadOnly(f"cannot {verb}: this adapter is read-only", reason="ReadOnly")

    # ------------------------------------------------------------------ reads

    async def _get_trainjob(self, name: str) -> Obj:
        try:
            return await self._kube.get(k.TRAINJOBS, name)
        except NotFound as exc:
            raise NotFound(
                f"trainjob {name} not found in namespace {self.namespace}"
                + (" (is Kubeflow Trainer installed?)" if "the server could not find" in exc.message else ""),
                reason=exc.reason, code=exc.code,
            ) from exc

    async def _node_views(self, pods: Sequence[Obj]) -> dict[str, d.NodeView]:
        """Get each Node a pod that may run sits on (get only: ceased needs no list permission)."""
        names = sorted({v.node for v in map(d.PodView.from_obj, pods) if v.node and v.may_run})
        views: dict[str, d.NodeView] = {}
        for name in names:
            try:
                views[name] = d.NodeView.from_obj(await self._kube.get(k.NODES, name))
            except NotFound:
                views[name] = d.NodeView.gone(name)
            except Forbidden:
                views[name] = d.NodeView.unreadable(name)
        return views

    async def _pods(self, name: str, job_id: str, submission: str) -> tuple[list[Obj], str]:
        """The namespace's pods of the object, both selections, in one consistent snapshot.

        The first list is a quorum read at revision R (paged with continue, RV never resent); the
        second is pinned to R with resourceVersionMatch=Exact, so together they are one snapshot.
        """
        by_jobset = f"{n.JOBSET_NAME_LABEL}={name}"
        if job_id:
            first = await self._kube.list(
                k.PODS, labels=f"{n.LABEL_JOB_ID}={job_id},{n.LABEL_SUBMISSION}={submission}"
            )
            second = await self._kube.list(
                k.PODS, labels=by_jobset, resource_version=first.resource_version, exact=True
            )
            return first.items + second.items, first.resource_version
        only = await self._kube.list(k.PODS, labels=by_jobset)
        return only.items, only.resource_version

    async def _snapshot(self, name: str, job_id: str, submission: str) -> Snapshot:
        jobset = await self._kube.get_or_none(k.JOBSETS, name)
        jobs = (await self._kube.list(k.JOBS, labels=f"{n.JOBSET_NAME_LABEL}={name}")).items
        pods, rv = await self._pods(name, job_id, submission)
        nodes = await self._node_views(pods)
        return Snapshot(jobset, jobs, pods, nodes, rv)

    async def _snapshots(
        self, objects: Sequence[tuple[str, str, str]], *, list_jobsets: bool = False
    ) -> dict[str, Snapshot]:
        """One consistent read for many objects of the namespace, keyed by object name.

        The same reads in the same order as ``_snapshot`` (JobSets, Jobs, then the two pod selections
        pinned to one revision, then Nodes), with set-based selectors, so k objects cost about as many
        requests as one and no more than their own pods. ``list_jobsets`` lists the namespace's JobSets
        in one call instead of one get per object (cheaper when the objects are most of the namespace).
        Each object's snapshot holds only its own pods and Jobs, as ``_snapshot`` would have read them.
        """
        names = sorted({name for name, _, _ in objects})
        if not names:
            return {}
        jobsets: dict[str, Obj | None]
        if list_jobsets:
            listed = {d.name_of(j): j for j in (await self._kube.list(k.JOBSETS)).items}
            jobsets = {name: listed.get(name) for name in names}
        else:  # one get each, sent together: the reads' latencies overlap, their order does not matter
            got = await asyncio.gather(*(self._kube.get_or_none(k.JOBSETS, name) for name in names))
            jobsets = dict(zip(names, got, strict=True))
        in_names = f"{n.JOBSET_NAME_LABEL} in ({','.join(names)})"
        jobs = (await self._kube.list(k.JOBS, labels=in_names)).items
        idents = {(job_id, sub) for _, job_id, sub in objects if job_id}
        pods: list[Obj]
        if idents:
            ids = ",".join(sorted({i for i, _ in idents}))
            subs = ",".join(sorted({s for _, s in idents}))
            pod_selector = f"{n.LABEL_JOB_ID} in ({ids}),{n.LABEL_SUBMISSION} in ({subs})"
            first = await self._kube.list(k.PODS, labels=pod_selector)
            second = await self._kube.list(k.PODS, labels=in_names, resource_version=first.resource_version,
                                           exact=True)
            pods, rv = first.items + second.items, first.resource_version
        else:
            only = await self._kube.list(k.PODS, labels=in_names)
            pods, rv = only.items, only.resource_version
        nodes = await self._node_views(pods)
        by_name: dict[str, list[Obj]] = {}
        by_ident: dict[tuple[str, str], list[Obj]] = {}
        for pod in pods:  # index once: each object then takes its own pods in O(its pods)
            labels = d.labels_of(pod)
            by_name.setdefault(str(labels.get(n.JOBSET_NAME_LABEL, "")), []).append(pod)
            by_ident.setdefault((str(labels.get(n.LABEL_JOB_ID, "")), str(labels.get(n.LABEL_SUBMISSION, ""))),
                                []).append(pod)
        jobs_of: dict[str, list[Obj]] = {}
        for job in jobs:
            jobs_of.setdefault(str(d.labels_of(job).get(n.JOBSET_NAME_LABEL, "")), []).append(job)
        out: dict[str, Snapshot] = {}
        for name, job_id, sub in objects:
            mine = by_name.get(name, []) + (by_ident.get((job_id, sub), []) if job_id else [])
            out[name] = Snapshot(jobsets.get(name), jobs_of.get(name, []), mine, nodes, rv)
        return out

    def _verdict(self, name: str, job_id: str, submission: str, snap: Snapshot) -> d.Verdict:
        return d.decide(
            name=name, job_id=job_id, submission=submission, pods=snap.pods, nodes=snap.nodes,
            jobset=snap.jobset, jobs=snap.jobs,
        )

    async def _workload(self, trainjob: Obj) -> Obj | None:
        uid = str((trainjob.get("metadata") or {}).get("uid") or "")
        if not uid:
            return None
        try:
            found = await self._kube.list(k.WORKLOADS, labels=f"{n.KUEUE_JOB_UID_LABEL}={uid}")
        except NotFound:
            return None
        return found.items[0] if found.items else None

    async def _our_checks(self) -> set[str] | None:
        """Names of the AdmissionChecks dispatch's controller owns; None if they cannot be listed."""
        try:
            checks = (await self._kube.list(k.ADMISSION_CHECKS)).items
        except (NotFound, Forbidden):
            return None
        return {d.name_of(c) for c in checks
                if (c.get("spec") or {}).get("controllerName") == n.CONTROLLER_NAME}

    @staticmethod
    def _check_of(workload: Obj | None, ours: set[str] | None) -> d.CheckView | None:
        """dispatch's check on the Workload; without the list of ours, the first check not yet Ready."""
        if workload is None:
            return None
        checks = (workload.get("status") or {}).get("admissionChecks") or []
        if ours is not None:
            mine = [c for c in checks if c.get("name") in ours]
        else:
            mine = [c for c in checks if c.get("state") != "Ready"]
        if not mine:
            return None
        c = mine[0]
        return d.CheckView(str(c.get("name")), str(c.get("state", "")), str(c.get("message", "")))

    def _status(self, trainjob: Obj, verdict: d.Verdict | None, check: d.CheckView | None,
                workload_note: str = "") -> Status:
        meta = trainjob.get("metadata") or {}
        return Status(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace") or self.namespace),
            state=d.state_of(trainjob),
            identity=d.identity_of(trainjob),
            cause=d.explain(trainjob, verdict, check, workload_note),
            mode="kueue" if d.queue_of(trainjob) else "plain",
            queue=d.queue_of(trainjob),
            created=_parse_time(meta.get("creationTimestamp")),
            remaining=verdict.remaining if verdict else (),
            resource_version=str(meta.get("resourceVersion", "")),
        )

    @staticmethod
    def _workload_note(workload: Obj | None) -> str:
        if workload is None:
            return ""
        if (workload.get("spec") or {}).get("active") is False:
            return "workload deactivated (held); release reactivates it"
        for cond in (workload.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "QuotaReserved" and cond.get("status") != "True":
                return f"waiting for quota: {cond.get('message') or cond.get('reason', '')}".rstrip(": ")
        return ""

    async def inspect(self, name: str) -> Status:
        """The object's state, identity and cause; a not-running object names what keeps it waiting."""
        n.validate_ref(name)
        trainjob = await self._get_trainjob(name)
        if d.state_of(trainjob) is State.RUNNING:
            return self._status(trainjob, None, None)
        ident = d.identity_of(trainjob)
        snap = await self._snapshot(name, ident.job_id, ident.submission)
        verdict = self._verdict(name, ident.job_id, ident.submission, snap)
        check = None
        note = ""
        if d.queue_of(trainjob):
            workload = await self._workload(trainjob)
            check = self._check_of(workload, await self._our_checks() if workload is not None else None)
            note = self._workload_note(workload)
        return self._status(trainjob, verdict, check, note)

    async def find(
        self,
        *,
        job_id: str | None = None,
        submission: str | None = None,
        state: State | Collection[State] | None = None,
    ) -> list[Status]:
        """Status of many objects with a constant number of list calls, however many match."""
        problems = []
        for field, value in (("job_id", job_id), ("submission", submission)):
            if value is not None and n.label_value_problem(value):
                problems.append(FieldCause(field, f"{value!r} is not a valid label value", "FieldValueInvalid"))
        n.check(problems)
        selector = [f"{n.LABEL_JOB_ID}={job_id}" if job_id else n.LABEL_JOB_ID]
        if submission:
            selector.append(f"{n.LABEL_SUBMISSION}={submission}")
        try:
            trainjobs = (await self._kube.list(k.TRAINJOBS, labels=",".join(selector))).items
        except NotFound as exc:
            raise NotFound("the TrainJob kind is not served: is Kubeflow Trainer installed in this cluster?",
                           reason=exc.reason, code=exc.code) from exc
        wanted: set[State] | None = None
        if state is not None:
            wanted = {state} if isinstance(state, State) else set(state)
        if wanted is not None:
            trainjobs = [t for t in trainjobs if d.state_of(t) in wanted]
        idle = [t for t in trainjobs if d.state_of(t) is not State.RUNNING]
        out: list[Status] = []
        if not idle:
            return sorted((self._status(t, None, None) for t in trainjobs), key=lambda s: s.name)
        first = await self._kube.list(k.PODS, labels=n.LABEL_JOB_ID)
        second = await self._kube.list(
            k.PODS, labels=n.JOBSET_NAME_LABEL, resource_version=first.resource_version, exact=True
        )
        pods = first.items + second.items
        jobsets = {d.name_of(j): j for j in (await self._list_or_empty(k.JOBSETS))}
        jobs = await self._list_or_empty(k.JOBS, labels=n.JOBSET_NAME_LABEL)
        nodes = await self._all_nodes(pods)
        workloads: dict[str, Obj] = {}
        ours: set[str] | None = None
        if any(d.queue_of(t) for t in idle):
            ours = await self._our_checks()
            for w in await self._list_or_empty(k.WORKLOADS):
                uid = d.labels_of(w).get(n.KUEUE_JOB_UID_LABEL)
                if uid:
                    workloads[uid] = w
        for t in trainjobs:
            if d.state_of(t) is State.RUNNING:
                out.append(self._status(t, None, None))
                continue
            name = d.name_of(t)
            ident = d.identity_of(t)
            verdict = d.decide(
                name=name, job_id=ident.job_id, submission=ident.submission, pods=pods, nodes=nodes,
                jobset=jobsets.get(name), jobs=jobs,
            )
            wl = workloads.get(str((t.get("metadata") or {}).get("uid")))
            check = self._check_of(wl, ours) if d.queue_of(t) else None
            note = self._workload_note(wl) if d.queue_of(t) else ""
            out.append(self._status(t, verdict, check, note))
        return sorted(out, key=lambda s: s.name)

    async def _list_or_empty(self, res: k.Res, labels: str | None = None) -> list[Obj]:
        try:
            return (await self._kube.list(res, labels=labels)).items
        except NotFound:
            return []

    async def _all_nodes(self, pods: Sequence[Obj]) -> dict[str, d.NodeView]:
        wanted = {v.node for v in map(d.PodView.from_obj, pods) if v.node and v.may_run}
        if not wanted:
            return {}
        try:
            listed = {d.name_of(o): d.NodeView.from_obj(o) for o in (await self._kube.list(k.NODES)).items}
        except Forbidden:
            return {name: d.NodeView.unreadable(name) for name in wanted}
        return {name: listed.get(name) or d.NodeView.gone(name) for name in wanted}

    async def ceased(self, name: str) -> Cessation:
        """Whether the object's processes are proven gone. Writes nothing; needs get on Nodes."""
        n.validate_ref(name)
        trainjob = await self._kube.get_or_none(k.TRAINJOBS, name)
        ident = d.identity_of(trainjob) if trainjob else Identity("", "", 0)
        pods, _ = await self._pods(name, ident.job_id, ident.submission)
        nodes = await self._node_views(pods)
        return d.cessation(
            trainjob=trainjob, name=name, job_id=ident.job_id, submission=ident.submission,
            pods=pods, nodes=nodes,
        )

    # ------------------------------------------------------------------ writes

    async def open(self, spec: JobSpec, *, hold: bool = True) -> Status:
        """Create the TrainJob, suspended. With ``hold=False`` admit it at once through the same check."""
        name = validate_spec(spec)
        self._writer("open")
        existing = (await self._kube.list(
            k.TRAINJOBS, labels=f"{n.LABEL_JOB_ID}={spec.job_id},{n.LABEL_SUBMISSION}={spec.submission}"
        )).items
        if existing:
            raise Refused(
                f"submission {spec.job_id}/{spec.submission} already exists as trainjob "
                f"{d.name_of(existing[0])}; choose a new submission", reason="AlreadyExists",
            )
        replicated = await self._runtime_jobs(spec)
        admission = 0
        if not hold and spec.queue is None:
            snap = await self._snapshot(name, spec.job_id, spec.submission)
            verdict = self._verdict(name, spec.job_id, spec.submission, snap)
            if not verdict.admissible:
                raise PodsRemain(name, verdict.detail(), [p.describe() for p in verdict.remaining],
                                 verdict.remaining)
            admission = 1 + max([0] + [d.PodView.from_obj(p).admission or 0 for p in snap.pods])
        body = self._trainjob_body(spec, name, replicated, admission, suspend=admission == 0)
        if spec.termination_grace_period_seconds is not None:
            await self._check_grace_kept(body)
        if admission:
            admission = max(admission, await self.ledger_floor(spec.job_id, spec.submission) + 1)
            body = self._trainjob_body(spec, name, replicated, admission, suspend=False)
        try:
            created = await self._kube.create(k.TRAINJOBS, body)
        except NotFound as exc:
            raise NotFound(
                "the TrainJob kind is not served: is Kubeflow Trainer installed in this cluster?",
                reason=exc.reason, code=exc.code,
            ) from exc
        if admission:
            await self.record_admission(spec.job_id, spec.submission, admission)
        return self._status(created, d.Verdict((), ()) if admission == 0 else None, None)

    async def _check_grace_kept(self, body: Obj) -> None:
        """Trainer before v2.3 has no terminationGracePeriodSeconds in runtime patches and prunes it
        silently; a dry-run create shows what the server would keep, so the user hears it, not nothing."""
        try:
            stored = await self._kube.create(k.TRAINJOBS, body, dry_run=True)
        except NotFound:
            return  # the create itself will explain the missing kind
        for entry in (stored.get("spec") or {}).get("runtimePatches") or []:
            if entry.get("manager") != n.PATCH_MANAGER:
                continue
            for rj in d._patch_replicated_jobs(entry):
                tmpl = ((rj.get("template") or {}).get("spec") or {}).get("template") or {}
                if "terminationGracePeriodSeconds" not in (tmpl.get("spec") or {}):
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

    async def _runtime_jobs(self, spec: JobSpec) -> list[str]:
        res = k.CLUSTER_RUNTIMES if spec.runtime_kind == "ClusterTrainingRuntime" else k.RUNTIMES
        try:
            runtime = await self._kube.get(res, spec.runtime)
        except NotFound as exc:
            raise NotFound(
                f"{spec.runtime_kind} {spec.runtime} not found"
                + (" in namespace " + self.namespace if res.namespaced else ""),
                reason=exc.reason, code=exc.code, causes=[FieldCause("runtime", "not found", "NotFound")],
            ) from exc
        rjs = ((((runtime.get("spec") or {}).get("template") or {}).get("spec") or {})
               .get("replicatedJobs") or [])
        names = [str(rj.get("name")) for rj in rjs if rj.get("name")]
        if not names:
            raise InvalidInput(f"{spec.runtime_kind} {spec.runtime} has no replicatedJobs", reason="Invalid")
        return names

    @staticmethod
    def _patch_entry(replicated: Sequence[str], labels: Mapping[str, str], spec: JobSpec) -> Obj:
        """dispatch's own runtime patch entry: identity labels (and the user's pod settings) per replicatedJob."""
        pod_template: Obj = {"metadata": {"labels": dict(labels)}}
        if spec.pod_annotations:
            pod_template["metadata"]["annotations"] = dict(spec.pod_annotations)
        pod_spec: Obj = {}
        if spec.termination_grace_period_seconds is not None:
            pod_spec["terminationGracePeriodSeconds"] = spec.termination_grace_period_seconds
        if spec.node_selector:
            pod_spec["nodeSelector"] = dict(spec.node_selector)
        if pod_spec:
            pod_template["spec"] = pod_spec
        return {
            "manager": n.PATCH_MANAGER,
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                {"name": rj, "template": {"spec": {"template": copy.deepcopy(pod_template)}}} for rj in replicated
            ]}}},
        }

    def _trainjob_body(self, spec: JobSpec, name: str, replicated: Sequence[str], admission: int,
                       *, suspend: bool) -> Obj:
        labels = dict(spec.labels)
        labels[n.LABEL_JOB_ID] = spec.job_id
        labels[n.LABEL_SUBMISSION] = spec.submission
        if spec.queue:
            labels[n.KUEUE_QUEUE_LABEL] = spec.queue
        if spec.priority_class:
            labels[n.KUEUE_PRIORITY_LABEL] = spec.priority_class
        pod_labels = {
            n.LABEL_JOB_ID: spec.job_id, n.LABEL_SUBMISSION: spec.submission,
            n.LABEL_ADMISSION: str(admission),
        }
        trainer: Obj = {}
        if spec.image:
            trainer["image"] = spec.image
        if spec.command:
            trainer["command"] = list(spec.command)
        if spec.args:
            trainer["args"] = list(spec.args)
        if spec.num_nodes is not None:
            trainer["numNodes"] = spec.num_nodes
        if spec.resources_per_node:
            trainer["resourcesPerNode"] = {"requests": dict(spec.resources_per_node),
                                           "limits": dict(spec.resources_per_node)}
        if spec.env:
            trainer["env"] = [{"name": key, "value": value} for key, value in spec.env.items()]
        body: Obj = {
            "apiVersion": k.TRAINJOBS.api_version,
            "kind": "TrainJob",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": {n.ANNOTATION_ADMISSION: str(admission)},
            },
            "spec": {
                "runtimeRef": {"name": spec.runtime, "apiGroup": n.TRAINER_GROUP, "kind": spec.runtime_kind},
                "suspend": suspend,
                "runtimePatches": [self._patch_entry(replicated, pod_labels, spec)],
            },
        }
        if trainer:
            body["spec"]["trainer"] = trainer
        return body

    async def ledger_floor(self, job_id: str, submission: str) -> int:
        """The highest A the namespace's ledger remembers for a submission (0 if none)."""
        ledger = await self._kube.get_or_none(k.CONFIGMAPS, n.LEDGER_NAME)
        value = ((ledger or {}).get("data") or {}).get(n.ledger_key(job_id, submission))
        return d._int_or_none(value) or 0

    async def ledger_floors(self) -> dict[str, int]:
        """The whole ledger in one read: ledger key → highest A (for deciding many objects at once)."""
        ledger = await self._kube.get_or_none(k.CONFIGMAPS, n.LEDGER_NAME)
        return {key: d._int_or_none(value) or 0 for key, value in ((ledger or {}).get("data") or {}).items()}

    async def record_admission(self, job_id: str, submission: str, admission: int) -> None:
        """Remember A in the ledger (never lowering it), so a closed and re-opened submission goes on
        from there. Conditioned on the ledger's resourceVersion; retried on conflict."""
        await self.record_admissions({n.ledger_key(job_id, submission): admission})

    async def record_admissions(self, admissions: Mapping[str, int]) -> None:
        """``record_admission`` for many ledger keys in one write (a controller admitting a batch)."""
        for _ in range(self.conflict_retries * 2):
            ledger = await self._kube.get_or_none(k.CONFIGMAPS, n.LEDGER_NAME)
            if ledger is None:
                try:
                    await self._kube.create(k.CONFIGMAPS, {
                        "apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": n.LEDGER_NAME, "labels": {"app.kubernetes.io/managed-by": "dispatch"}},
                        "data": {key: str(a) for key, a in admissions.items()},
                    })
                except Refused as exc:
                    if exc.reason == "AlreadyExists":
                        continue
                    raise
                return
            data = ledger.get("data") or {}
            higher = {key: str(a) for key, a in admissions.items() if (d._int_or_none(data.get(key)) or 0) < a}
            if not higher:
                return
            try:
                await self._kube.merge_patch(k.CONFIGMAPS, n.LEDGER_NAME, {
                    "metadata": {"resourceVersion": (ledger.get("metadata") or {}).get("resourceVersion")},
                    "data": higher,
                })
            except Unreachable as exc:
                if exc.code == 409:
                    continue
                raise
            return
        raise Unreachable(f"the admission ledger {n.LEDGER_NAME} kept changing; retry", reason="Conflict", code=409)

    async def raise_admission(self, trainjob: Obj, admission: int, *, floor: int | None = None,
                              record: bool = True) -> Obj:
        """Write A on the TrainJob and into dispatch's runtime patch, conditioned on the RV read.

        ``admission`` is a floor: the ledger may lift it (an earlier, closed object of the same submission
        went higher). The A written is the returned TrainJob's annotation (``_decision.admission_of``); it is
        recorded in the ledger after the TrainJob, so a conflict retries the same number instead of skipping
        one. ``close`` records the object's A too, which covers a crash between the two writes.
        A caller deciding many objects passes ``floor`` (the ledger it read once) and ``record=False``,
        and records them all with one ``record_admissions`` before it lets any of them start.
        Server-side apply of our own fields only: Kueue's runtime patch entry (same list, another key)
        is left alone, where a merge patch would replace the whole list.
        """
        meta = trainjob.get("metadata") or {}
        ident = d.identity_of(trainjob)
        if ident.job_id and ident.submission:
            if floor is None:
                floor = await self.ledger_floor(ident.job_id, ident.submission)
            admission = max(admission, floor + 1)
        current = next((e for e in (trainjob.get("spec") or {}).get("runtimePatches") or []
                        if e.get("manager") == n.PATCH_MANAGER), None)
        if current is None or not d.patched_replicated_jobs(trainjob):
            raise Refused(f"trainjob {meta.get('name')} has no dispatch runtime patch; it was not opened "
                          "by dispatch", reason="NotDispatchObject")
        entry = copy.deepcopy(current)
        entry.pop("time", None)  # stamped by Trainer's defaulting webhook; not ours to own
        labels = {n.LABEL_JOB_ID: ident.job_id, n.LABEL_SUBMISSION: ident.submission,
                  n.LABEL_ADMISSION: str(admission)}
        tmpl_spec = entry.setdefault("trainingRuntimeSpec", {}).setdefault("template", {}).setdefault("spec", {})
        for rj in tmpl_spec.get("replicatedJobs") or []:
            template = rj.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
            template.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
        body: Obj = {
            "apiVersion": k.TRAINJOBS.api_version,
            "kind": "TrainJob",
            "metadata": {
                "name": meta.get("name"),
                "namespace": meta.get("namespace") or self.namespace,
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {n.ANNOTATION_ADMISSION: str(admission)},
            },
            "spec": {"runtimePatches": [entry]},
        }
        raised = await self._kube.apply(k.TRAINJOBS, str(meta.get("name")), body)
        if record and ident.job_id and ident.submission:
            await self.record_admission(ident.job_id, ident.submission, admission)
        return raised

    async def release(self, name: str) -> Identity:
        """Admit the object if no pod of it may still run; else write nothing and raise PodsRemain.

        Idempotent: releasing an admitted object returns its identity without writing. In Kueue mode
        the hold is the Workload's ``active`` flag, and Kueue (through dispatch's check) admits.
        """
        n.validate_ref(name)
        self._writer("release")
        for _ in range(self.conflict_retries):
            trainjob = await self._get_trainjob(name)
            ident = self._require_dispatch(trainjob, name)
            state = d.state_of(trainjob)
            if state is State.RUNNING:
                return ident
            if state in (State.SUCCEEDED, State.FAILED, State.CLOSING):
                raise Refused(f"trainjob {name} is {state.value.lower()}; open a new submission to run again",
                              reason=state.value)
            if d.queue_of(trainjob):
                await self._set_workload_active(trainjob, True)
                return ident
            snap = await self._snapshot(name, ident.job_id, ident.submission)
            verdict = self._verdict(name, ident.job_id, ident.submission, snap)
            if not verdict.admissible:
                raise PodsRemain(name, verdict.detail(), [p.describe() for p in verdict.remaining],
                                 verdict.remaining)
            admission = d.next_admission(trainjob, snap.pods)
            try:
                raised = await self.raise_admission(trainjob, admission)
            except Unreachable as exc:
                if exc.code == 409:
                    continue
                raise
            admission = d.admission_of(raised)
            if await self._unsuspend(name, raised, admission):
                return Identity(ident.job_id, ident.submission, admission)
        raise Unreachable(f"trainjob {name} kept changing under release; retry", reason="Conflict", code=409)

    async def _unsuspend(self, name: str, raised: Obj, admission: int) -> bool:
        """The second admitting write, conditioned on the TrainJob as our raise left it.

        Trainer writes the TrainJob's status right after it is created, so this write often meets a
        409. Raising A again would skip a number for nothing: if the TrainJob is still suspended, with
        our A and the same generation (no spec change since our raise, so it stayed suspended and no
        pod can have started since the consistent read), only the resourceVersion moved, and the
        unsuspend is retried on the fresh one. Anything else: False, and release decides afresh.
        """
        generation = (raised.get("metadata") or {}).get("generation")
        current = raised
        for _ in range(self.conflict_retries):
            rv = (current.get("metadata") or {}).get("resourceVersion")
            try:
                await self._kube.merge_patch(
                    k.TRAINJOBS, name, {"metadata": {"resourceVersion": rv}, "spec": {"suspend": False}}
                )
                return True
            except Unreachable as exc:
                if exc.code != 409:
                    raise
            fresh = await self._kube.get_or_none(k.TRAINJOBS, name)
            if (fresh is None or d.is_deleting(fresh) or not d.is_suspended(fresh)
                    or (fresh.get("metadata") or {}).get("generation") != generation
                    or d.admission_of(fresh) != admission):
                return False
            current = fresh
        return False


    @staticmethod
    def _require_dispatch(trainjob: Obj, name: str) -> Identity:
        ident = d.identity_of(trainjob)
        if not ident.job_id or not ident.submission:
            raise Refused(
                f"trainjob {name} has no {n.LABEL_JOB_ID}/{n.LABEL_SUBMISSION} labels; it is not a dispatch "
                "object", reason="NotDispatchObject",
            )
        return ident

    async def _set_workload_active(self, trainjob: Obj, active: bool) -> None:
        workload = await self._workload(trainjob)
        if workload is None:
            if active:
                return
            raise Unreachable(f"Kueue has not created a Workload for {d.name_of(trainjob)} yet; retry",
                              reason="NoWorkload")
        if (workload.get("spec") or {}).get("active", True) == active:
            return
        await self._kube.merge_patch(k.WORKLOADS, d.name_of(workload), {"spec": {"active": active}})

    async def hold(self, name: str) -> Status:
        """Suspend the object (in Kueue mode: deactivate its Workload). Its pods then start to go."""
        n.validate_ref(name)
        self._writer("hold")
        trainjob = await self._get_trainjob(name)
        self._require_dispatch(trainjob, name)
        if d.queue_of(trainjob):
            await self._set_workload_active(trainjob, False)
        elif not d.is_suspended(trainjob):
            await self._kube.merge_patch(k.TRAINJOBS, name, {"spec": {"suspend": True}})
        return await self.inspect(name)

    async def close(self, name: str) -> tuple[RemainingPod, ...]:
        """Delete the object. Returns the pods that remain: they still block a same-named new object."""
        n.validate_ref(name)
        self._writer("close")
        trainjob = await self._get_trainjob(name)
        ident = d.identity_of(trainjob)
        highest = max(ident.admission, d.patch_admission_of(trainjob))
        if ident.job_id and ident.submission and highest:
            await self.record_admission(ident.job_id, ident.submission, highest)  # outlives the object
        try:
            await self._kube.delete(k.TRAINJOBS, name, propagation="Background")
        except NotFound:
            pass
        pods, _ = await self._pods(name, ident.job_id, ident.submission)
        nodes = await self._node_views(pods)
        views = d.object_pods(pods, name=name, job_id=ident.job_id, submission=ident.submission)
        return d.remaining(views, nodes)

    # ------------------------------------------------------------------ waiting and logs

    async def wait(
        self,
        name: str,
        states: State | Collection[State],
        *,
        timeout: float = 600.0,
        interval: float = 1.0,
        on_status: Callable[[Status], None] | None = None,
    ) -> Status:
        """Poll until the object reaches one of ``states``; Unreachable(reason=Timeout) after ``timeout``."""
        wanted = {states} if isinstance(states, State) else set(states)
        deadline = time.monotonic() + timeout
        while True:
            status = await self.inspect(name)
            if on_status is not None:
                on_status(status)
            if status.state in wanted:
                return status
            if time.monotonic() >= deadline:
                raise Unreachable(
                    f"timed out after {timeout:g}s waiting for {name} to be "
                    f"{'/'.join(sorted(s.value for s in wanted))}; it is {status.state.value}: {status.cause}",
                    reason="Timeout",
                )
            await asyncio.sleep(min(interval, max(0.0, deadline - time.monotonic())))

    async def logs(self, name: str, *, node: int = 0, follow: bool = False) -> AsyncIterator[str]:
        """Log lines of the object's node ``node`` (trainer container), like TrainerClient.get_job_logs."""
        n.validate_ref(name)
        pods = (await self._kube.list(k.PODS, labels=f"{n.JOBSET_NAME_LABEL}={name}")).items
        live = [p for p in pods if not d.is_deleting(p)] or pods
        index = str(node)
        chosen = [p for p in live if d.labels_of(p).get("batch.kubernetes.io/job-completion-index") == index
                  or (d.annotations_of(p).get("batch.kubernetes.io/job-completion-index") == index)]
        if not chosen:
            raise NotFound(f"no pod of {name} for node {node} yet", reason="NotFound")
        async for line in self._kube.logs(d.name_of(chosen[0]), follow=follow):
            yield line


class Adapter:
    """Synchronous facade over ``AsyncAdapter``, for scripts and the CLI."""

    def __init__(self, core: AsyncAdapter, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self._core = core
        self._loop = loop
        self._thread = thread

    @classmethod
    def connect(
        cls,
        namespace: str | None = None,
        *,
        kubeconfig: str | Path | None = None,
        context: str | None = None,
        read_only: bool = False,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> Adapter:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="dispatch-loop", daemon=True)
        thread.start()

        async def build() -> AsyncAdapter:
            return AsyncAdapter.connect(
                namespace, kubeconfig=kubeconfig, context=context, read_only=read_only, transport=transport
            )

        try:
            core = asyncio.run_coroutine_threadsafe(build(), loop).result()
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            raise
        return cls(core, loop, thread)

    def _run(self, coro: Awaitable[T]) -> T:
        async def wrap() -> T:
            return await coro

        fut: Future[T] = asyncio.run_coroutine_threadsafe(wrap(), self._loop)
        try:
            return fut.result()
        except KeyboardInterrupt:
            fut.cancel()
            raise

    @property
    def namespace(self) -> str:
        return self._core.namespace

    @property
    def read_only(self) -> bool:
        return self._core.read_only

    @property
    def core(self) -> AsyncAdapter:
        return self._core

    def open(self, spec: JobSpec, *, hold: bool = True) -> Status:
        return self._run(self._core.open(spec, hold=hold))

    def release(self, name: str) -> Identity:
        return self._run(self._core.release(name))

    def hold(self, name: str) -> Status:
        return self._run(self._core.hold(name))

    def inspect(self, name: str) -> Status:
        return self._run(self._core.inspect(name))

    def find(self, *, job_id: str | None = None, submission: str | None = None,
             state: State | Collection[State] | None = None) -> list[Status]:
        return self._run(self._core.find(job_id=job_id, submission=submission, state=state))

    def ceased(self, name: str) -> Cessation:
        return self._run(self._core.ceased(name))

    def close(self, name: str) -> tuple[RemainingPod, ...]:
        return self._run(self._core.close(name))

    def wait(self, name: str, states: State | Collection[State], *, timeout: float = 600.0,
             interval: float = 1.0, on_status: Callable[[Status], None] | None = None) -> Status:
        return self._run(self._core.wait(name, states, timeout=timeout, interval=interval,
                                         on_status=on_status))

    def logs(self, name: str, *, node: int = 0, follow: bool = False) -> Iterator[str]:
        agen = self._core.logs(name, node=node, follow=follow)
        while True:
            try:
                yield self._run(agen.__anext__())
            except StopAsyncIteration:
                return

    def shutdown(self) -> None:
        """Close the connection and stop the private loop."""
        if not self._loop.is_running():
            return
        try:
            self._run(self._core.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def __enter__(self) -> Adapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
