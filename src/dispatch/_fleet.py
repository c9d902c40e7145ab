"""MultiKueue: the worker clusters a manager's TrainJob may have run in, and reading them.

Under MultiKueue the manager's TrainJob never has pods: a copy of it runs in one worker, and after an eviction
MultiKueue deletes that copy and dispatches again, possibly elsewhere, without waiting for the copy's pods.
So the rule reads every worker the previous execution may have run in, through the credentials Kueue itself
uses (the MultiKueueCluster's kubeconfig Secret), with one consistent read per worker. A worker that cannot
be read proves nothing; only its own nodes' state, read from it, or an operator's confirmation that it is
down does. The confirmation is tied to the loss Kueue observed (the Active condition's transition time), so
it lapses by itself once the worker comes back and is lost again.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _api as api
from . import _decision as d
from . import _names as n
from . import _trainer as tr
from ._api import Obj
from ._kube import Kube
from ._read import Reader, Snapshot, Target
from ._records import Cessation
from ._views import items, mapping, text
from .errors import DispatchError, Forbidden, InvalidInput, NotFound, Refused

MULTIKUEUE = n.MULTIKUEUE
"""The ``spec.managedBy`` Kueue's webhook gives a TrainJob queued to a ClusterQueue with MultiKueue's check."""
MULTIKUEUE_CONTROLLER = MULTIKUEUE
"""The ``controllerName`` of MultiKueue's AdmissionCheck."""
WORKER_DOWN = f"{n.DOMAIN}/worker-down"
"""Annotation on a MultiKueueCluster: the operator confirmed the worker is down. Its value is the
``lastTransitionTime`` of the Active=False condition it confirms."""
SECRET_KEY = "kubeconfig"
"""The key of the worker's Secret that holds its kubeconfig (Kueue's ``MultiKueueConfigSecretKey``)."""
DEFAULT_KUEUE_NAMESPACE = "kueue-system"
READ_TIMEOUT = 10.0
"""Seconds one worker's read may take: a partitioned worker must not stall the manager's decisions."""
NAME_LIMIT = 253


@dataclass(frozen=True)
class WorkerView:
    """A MultiKueueCluster as dispatch needs it, parsed strictly."""

    name: str
    secret: str
    """The Secret (in Kueue's namespace) holding its kubeconfig; "" when it is reached another way."""
    unreadable: str
    """Why dispatch cannot read it at all (a kubeconfig at a path inside Kueue's pod, a ClusterProfile)."""
    active: str
    """Kueue's Active condition: "True", "False" or "Unknown"."""
    active_reason: str
    active_message: str
    lost_since: str
    """The Active condition's lastTransitionTime while it is False."""
    confirmed: str
    """The lost_since an operator confirmed as down ("" if none)."""
    resource_version: str = ""

    @staticmethod
    def from_obj(obj: Mapping[str, Any]) -> WorkerView:
        meta = mapping(obj.get("metadata"))
        spec = mapping(obj.get("spec"))
        source = mapping(spec.get("clusterSource")) or spec  # v1beta2 nests it; v1beta1 had it at the top
        kubeconfig = mapping(source.get("kubeConfig"))
        location, kind = text(kubeconfig.get("location")), text(kubeconfig.get("locationType")) or "Secret"
        secret, unreadable = "", ""
        if kubeconfig and kind == "Secret" and location:
            secret = location
        elif kubeconfig and kind == "Path":
            unreadable = (f"its kubeconfig is the file {location[:NAME_LIMIT]!r} inside Kueue's pod, which dispatch "
                          "cannot read; store it in a Secret (locationType: Secret)")
        elif source.get("clusterProfileRef"):
            unreadable = "it is reached through a ClusterProfile, which dispatch does not read yet; use a Secret"
        else:
            unreadable = "its MultiKueueCluster names no kubeconfig Secret"
        active = next((c for c in items(mapping(obj.get("status")).get("conditions"))
                       if c.get("type") == "Active"), {})
        status = text(active.get("status")) or "Unknown"
        lost = text(active.get("lastTransitionTime")) if status == "False" else ""
        return WorkerView(
            name=text(meta.get("name"))[:NAME_LIMIT], secret=secret[:NAME_LIMIT], unreadable=unreadable,
            active=status, active_reason=text(active.get("reason"))[:100],
            active_message=text(active.get("message"))[:300], lost_since=lost[:40],
            confirmed=text(mapping(meta.get("annotations")).get(WORKER_DOWN))[:40],
            resource_version=text(meta.get("resourceVersion")),
        )

    @property
    def down_confirmed(self) -> bool:
        """The operator confirmed this very loss (not an earlier one the worker has since come back from)."""
        return bool(self.confirmed) and self.active == "False" and self.confirmed == self.lost_since

    def kueue_says(self) -> str:
        reason = f", {self.active_reason}" if self.active_reason else ""
        message = f": {self.active_message}" if self.active_message else ""
        return f"Active={self.active}{reason}{message}"


def confirm_patch(worker: WorkerView) -> Obj:
    """The operator's confirmation that ``worker`` is down: refused unless Kueue itself has lost it
    (Active=False), so the annotation names the loss it vouches for and lapses with it."""
    if worker.active != "False" or not worker.lost_since:
        raise Refused(f"multikueuecluster {worker.name} is {worker.kueue_says()} as Kueue sees it: only a worker "
                      "Kueue has lost (Active=False) can be confirmed down; a reachable worker is read, not trusted "
                      "to be down", reason="WorkerNotLost")
    return {"metadata": {"resourceVersion": worker.resource_version,
                         "annotations": {WORKER_DOWN: worker.lost_since}}}


@dataclass(frozen=True)
class WorkerRead:
    """What one worker showed of the objects read: a snapshot per TrainJob name, or why it showed nothing."""

    worker: str
    snapshots: Mapping[str, Snapshot]
    problem: str = ""
    """Why it could not be read ("" when read)."""
    confirmed_down: bool = False
    """Unreadable, and the operator confirmed this loss: its pods have stopped."""
    removed: bool = False
    """No MultiKueueCluster names it any more (a record remembers it): ``admin worker-down`` makes records forget it."""

    def verdict(self, target: Target) -> d.WorkerVerdict:
        """What this worker showed of ``target``: its verdict, or why it could not be read."""
        if self.problem:
            return d.WorkerVerdict(self.worker, None, self.problem, self.confirmed_down, self.removed)
        return d.WorkerVerdict(self.worker, self.snapshots[target.name].verdict(target))


def kubeconfig_of(secret: Mapping[str, Any], where: str) -> str:
    """The kubeconfig text a worker's Secret holds, or a refusal naming what is wrong with it."""
    data = mapping(secret.get("data")).get(SECRET_KEY)
    if not isinstance(data, str) or not data:
        raise Refused(f"{where} has no key {SECRET_KEY!r}", reason="BadWorkerSecret")
    try:
        return base64.b64decode(data, validate=True).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise Refused(f"{where} key {SECRET_KEY!r} is not base64 UTF-8 text", reason="BadWorkerSecret") from None


Connect = Callable[[str, str, float], Kube]
"""(kubeconfig text, where it came from, timeout) -> a client of that worker."""


def _connect(text: str, source: str, timeout: float) -> Kube:
    return Kube.connect_inline(text, source, namespace="default", timeout=timeout)


class Fleet:
    """The manager's view of its workers: their MultiKueueClusters, and a client for each, kept while its
    Secret is unchanged."""

    def __init__(self, kube: Kube, *, kueue_namespace: str = DEFAULT_KUEUE_NAMESPACE,
                 timeout: float = READ_TIMEOUT, connect: Connect | None = None) -> None:
        self.kube = kube
        self.kueue_namespace = kueue_namespace
        self.timeout = timeout
        self.connect: Connect = connect or _connect
        """Builds a worker's client from its kubeconfig text (tests reach fake workers through it)."""
        self._clients: dict[str, tuple[str, Kube]] = {}

    async def aclose(self) -> None:
        for _, client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    async def workers(self) -> dict[str, WorkerView]:
        """Every MultiKueueCluster, by name (none when MultiKueue's kinds are not served here)."""
        try:
            listed = await self.kube.list(api.MULTIKUEUE_CLUSTERS)
        except NotFound:
            return {}
        views = (WorkerView.from_obj(o) for o in listed.items)
        return {v.name: v for v in views if v.name}

    async def worker(self, name: str) -> WorkerView:
        try:
            return WorkerView.from_obj(await self.kube.get(api.MULTIKUEUE_CLUSTERS, name))
        except NotFound:
            raise NotFound(f"multikueuecluster {name} not found", reason="NotFound", code=404) from None

    async def confirm_down(self, name: str) -> WorkerView:
        """Write the operator's confirmation that worker ``name`` is down (see ``confirm_patch``)."""
        if not name or len(name) > NAME_LIMIT:
            raise InvalidInput(f"worker name {name[:60]!r} is not a MultiKueueCluster name")
        worker = await self.worker(name)
        if worker.down_confirmed:
            return worker
        patched = await self.kube.merge_patch(api.MULTIKUEUE_CLUSTERS, name, confirm_patch(worker))
        return WorkerView.from_obj(patched)

    async def _client(self, worker: WorkerView, namespace: str) -> Kube:
        where = f"secret {self.kueue_namespace}/{worker.secret}"
        secret = await self.kube.get(api.SECRETS, worker.secret, namespace=self.kueue_namespace)
        version = text(mapping(secret.get("metadata")).get("resourceVersion"))
        cached = self._clients.get(worker.name)
        if cached is None or cached[0] != version:
            if cached is not None:
                await cached[1].aclose()
            client = self.connect(kubeconfig_of(secret, where), f"{where} (key {SECRET_KEY})", self.timeout)
            client.retries = 1  # a worker that does not answer is reported, not retried into the manager's latency
            self._clients[worker.name] = (version, client)
            cached = self._clients[worker.name]
        return cached[1].in_namespace(namespace)

    async def read(self, namespace: str, targets: Sequence[Target], names: Collection[str],
                   workers: Mapping[str, WorkerView] | None = None) -> dict[str, WorkerRead]:
        """One consistent read of ``targets`` in each worker of ``names`` (concurrently, each bounded by
        the timeout); a worker without a MultiKueueCluster any more, or one that fails, is a problem."""
        known = workers if workers is not None else await self.workers()
        reads = await asyncio.gather(*(self._read_one(namespace, targets, name, known.get(name))
                                       for name in sorted(set(names))))
        return {r.worker: r for r in reads}

    async def _read_one(self, namespace: str, targets: Sequence[Target], name: str,
                        worker: WorkerView | None) -> WorkerRead:
        if worker is None:
            return WorkerRead(name, {}, f"multikueuecluster {name} no longer exists, so its pods cannot be read",
                              removed=True)
        problem = worker.unreadable
        if not problem:
            try:
                client = await self._client(worker, namespace)
                snaps = await asyncio.wait_for(Reader(client).read(targets), self.timeout)
                return WorkerRead(name, snaps)
            except TimeoutError:
                problem = f"no answer within {self.timeout:.0f}s"
            except DispatchError as exc:
                problem = str(exc)[:300]
        if worker.active != "True":
            problem = f"{problem}; Kueue sees it {worker.kueue_says()}"
        return WorkerRead(name, {}, problem, confirmed_down=worker.down_confirmed)


async def ceased_across(fleet: Fleet, reader: Reader, tj: tr.TrainJobView, local: d.Verdict, here: Cessation
                        ) -> Cessation:
    """``ceased`` under MultiKueue, once this cluster's part is proven (``here``): the pods are in workers, read
    as dispatch's check reads them, where this role may. The fleet is closed after."""
    try:
        workers = await fleet.workers()
        record = (await reader.status_records([(tj.job_id, tj.submission)])).get((tj.job_id, tj.submission))
        names = set(workers) | set(record.clusters if record is not None else ())
        reads = await fleet.read(reader.namespace, [Target.of(tj)], names, workers)
    except Forbidden:
        return Cessation(False, f"trainjob {tj.name} is dispatched by MultiKueue: its pods are in worker clusters, "
                         "which this role cannot read; dispatch's check on the manager reads them "
                         f"(`dispatch status {tj.name}` shows what it says)")
    finally:
        await fleet.aclose()
    seen = d.fleet_workers(tj, record, workers, {w: r.verdict(Target.remote(tj)) for w, r in reads.items()})
    verdict = d.across(local, seen)
    if not verdict.admissible:
        return Cessation(False, verdict.detail(), remaining=verdict.remaining, ends=here.ends)
    confirmed = [w.worker for w in seen if w.verdict is None]
    read = [w.worker for w in seen if w.verdict is not None]
    why = f"{here.reason}; no pod remains in worker {', '.join(read)}" if read else here.reason
    if confirmed:
        why += f"; worker {', '.join(confirmed)} confirmed down by an operator"
    return Cessation(True, why, ends=here.ends)
