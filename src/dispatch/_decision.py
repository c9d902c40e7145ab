"""The rule, as pure functions over parsed views: no I/O, no clock, no client.

Nothing re-admits an object while any pod of it may still run. Given what one consistent read saw
(the TrainJob, its JobSet and child Jobs, the namespace's pods selected two independent ways, and the
Nodes those pods sit on), these functions say whether an admission may proceed, which A it carries,
whether a decision still holds after a conflict, whether Kueue lets dispatch decide a Workload now, and
every sentence the status output, the admission check, Events and errors use. Everything that decides
lives here so it can be tested exhaustively; the admission core, the adapter and the controller only
fetch and write.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from ._identity import ADMISSION_LIMIT, RecordView, describe_missing
from ._kueue import WAITING_PREFIX, CheckEntry, Owner, WorkloadView
from ._names import (
    ANNOTATION_ADMISSION,
    ANNOTATION_MARK_SEEN,
    ANNOTATION_STARTED,
    ANNOTATION_TOKEN,
    LABEL_ADMISSION,
    LABEL_JOB_ID,
    LABEL_SUBMISSION,
    MULTIKUEUE_ORIGIN_LABEL,
    PATCH_MANAGER,
    POD_KEPT_LABELS,
    PREBUILT_WORKLOAD_LABEL,
)
from ._records import Cause, Cessation, PodEnd, RemainingPod, State
from ._trainer import (
    OWN_POD_LABELS,
    TrainJobView,
    directive_phrases,
    effective_pod_labels,
    foreign_settings,
    uncovered,
)
from ._views import (
    POD_FINALIZER,
    PROOF_KUBELET,
    PROOF_UNPROVEN,
    PROVEN,
    TERMINAL_PHASES,
    EventView,
    JobSetView,
    JobView,
    NodeView,
    PodView,
    instant,
    labels_of,
)

__all__ = [
    "TERMINAL_PHASES", "WAITING_PREFIX", "CheckEntry", "EventView", "JobSetView", "JobView", "NodeView", "Plan",
    "PodView",
    "Verdict", "cessation", "decide", "ends", "explain", "guard", "next_admission", "object_pods", "pod_start_problem",
    "releasable",
    "remaining",
    "waiting_message",
]

MESSAGE_LIMIT = 8000
"""Kueue allows 32768 characters in a check message; a few thousand name the pods and keep Workloads small."""


# --------------------------------------------------------------------------- pods


def object_pods(pods: Iterable[PodView], *, name: str, job_id: str, submission: str) -> list[PodView]:
    """The object's pods from both selections, each once, in name order."""
    seen: dict[str, PodView] = {}
    for pod in pods:
        if pod.selected(name=name, job_id=job_id, submission=submission):
            seen.setdefault(pod.uid, pod)
    return sorted(seen.values(), key=lambda p: p.name)


def remaining(pods: Sequence[PodView], nodes: Mapping[str, NodeView]) -> tuple[RemainingPod, ...]:
    """The pods that may still run (every pod whose end its kubelet has not confirmed), each with its
    node and node state."""
    out = []
    for pod in pods:
        if not pod.may_run:
            continue
        node = nodes.get(pod.node) if pod.node else None
        state = node.state_text() if node else ("not readable" if pod.node else "")
        end = pod.end(node)
        held = pod.ours and pod.deleting and pod.deletion_grace == 0 and end == PROOF_UNPROVEN
        why = pod.unproven_why(node)
        if pod.ours and end in PROVEN and end != PROOF_KUBELET:
            why = (f"its end is proven ({end}); dispatch's controller removes dispatch's finalizer so it goes "
                   f"(without a controller running: `dispatch admin release-pod {pod.name}`)")
        elif not pod.ours and end in PROVEN and end != PROOF_KUBELET and pod.deleting and pod.finalizers:
            why = foreign_finalizer_text(pod, end)
        out.append(RemainingPod(pod.name, pod.node, state, pod.phase, pod.deleting, pod.admission,
                                pod.deletion_timestamp, held=held, why=why, proven=end in PROVEN))
    return tuple(out)


FOREIGN_FINALIZER = "keeps it in the API though it can never run"
"""The words that mark a deleted pod whose end is proven, held by another controller's finalizer (the campaign
runner acts on them)."""


def foreign_finalizer_text(pod: PodView, end: str) -> str:
    """Why a deleted pod whose end is proven stays, when the finalizer holding it is not dispatch's, and the way out.

    Seen on the testbed (issue 34): a pod never scheduled, deleted with its Job, kept for 40 minutes by the Job
    controller's ``batch.kubernetes.io/job-tracking`` after kube-apiserver restarts (the controller removes it
    from a pod its Job no longer exists for, and missed this one). dispatch waits for the pod to go, and nothing
    of dispatch's removes another controller's finalizer."""
    held = ", ".join(f[:80] for f in pod.finalizers[:4])
    return (f"its end is proven ({end}), but finalizer {held} {FOREIGN_FINALIZER} (the Job controller removes "
            "batch.kubernetes.io/job-tracking once it has counted the pod, and can miss one whose Job is gone after "
            f"a kube-apiserver restart): `kubectl patch pod {pod.name} --type=json -p "
            "'[{\"op\":\"remove\",\"path\":\"/metadata/finalizers\"}]'` in the object's namespace removes it")


def ends(pods: Sequence[PodView], nodes: Mapping[str, NodeView]) -> tuple[PodEnd, ...]:
    """How each pod's end is proven (``kubelet-confirmed``, ``node-deleted``, ``out-of-service``,
    ``not-scheduled``) or ``unproven``."""
    return tuple(PodEnd(p.name, p.node, p.end(nodes.get(p.node) if p.node else None), p.phase, p.ours)
                 for p in pods)


def releasable(pods: Iterable[PodView], nodes: Mapping[str, NodeView]) -> list[PodView]:
    """Pods carrying dispatch's finalizer whose end is proven: the finalizer may go (nothing else may
    remove it, so a pod that may still run stays visible to the rule, even after a force delete)."""
    return [p for p in pods if p.ours and p.end(nodes.get(p.node) if p.node else None) in PROVEN]


def stuck_text(pods: Sequence[RemainingPod]) -> str:
    """Why a pod deleted for good (force delete, PodGC) is still in the API: its end is unproven."""
    out = []
    for p in pods:
        if not p.held or p.why:  # a pod with a why names its own way out
            continue
        marked = (f", marked {p.phase} by someone other than its kubelet" if p.phase in TERMINAL_PHASES else "")
        where = f"node {p.node} is {p.node_state}" if p.node else "it has no node"
        out.append(
            f"pod {p.qualified} was deleted for good{marked}, but its end is unproven (its kubelet has not "
            f"confirmed it and {where}, neither deleted nor out-of-service), so dispatch's finalizer keeps it; "
            f"once {p.node or 'its node'} is confirmed down, taint it node.kubernetes.io/out-of-service or run "
            f"`dispatch admin release-pod {p.name} --node-confirmed-down`")
    return "; ".join(out)


def why_text(pods: Sequence[RemainingPod]) -> str:
    """Why each pod that is not simply running is still unproven, and what ends the wait."""
    return "; ".join(f"pod {p.qualified}: {p.why}" for p in pods if p.why)


def describe_pods(pods: Sequence[RemainingPod]) -> str:
    return ", ".join(p.describe() for p in pods)


def remaining_detail(pods: Sequence[RemainingPod]) -> str:
    """``remaining pods: <pod> on <node> (<node state>), ...``, the seed's exact form."""
    return f"remaining pods: {describe_pods(pods)}"


def waiting_message(pods: Sequence[RemainingPod], blockers: Sequence[str] = ()) -> str:
    """The Kueue admission check message while pods remain."""
    parts = []
    if pods:
        parts.append(
            "waiting for pods of the previous execution to go: "
            + ", ".join(f"{p.qualified} on {p.node or 'no node'}" for p in pods)
        )
    parts.extend(blockers)
    return "; ".join(parts)


# --------------------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class Verdict:
    """Whether an admission may proceed now, and what stands in its way."""

    remaining: tuple[RemainingPod, ...]
    blockers: tuple[str, ...]
    """Non-pod reasons: a JobSet or child Job whose suspension has not yet taken effect."""

    @property
    def admissible(self) -> bool:
        return not self.remaining and not self.blockers

    def detail(self) -> str:
        parts = []
        if self.remaining:
            parts.append(remaining_detail(self.remaining))
            for text in (why_text(self.remaining), stuck_text(self.remaining)):
                if text:
                    parts.append(text)
        parts.extend(self.blockers)
        return "; ".join(parts)


@dataclass(frozen=True)
class WorkerVerdict:
    """What one MultiKueue worker showed of an object: its verdict, or why it could not be read."""

    worker: str
    verdict: Verdict | None
    problem: str = ""
    confirmed_down: bool = False
    """Unreadable, and an operator confirmed that Kueue's loss of it is the machine being down."""
    removed: bool = False
    """No MultiKueueCluster names it any more: only the submission's identity record remembers it."""


def unreadable_text(worker: str, problem: str, *, removed: bool = False) -> str:
    if removed:
        return (f"worker {worker}, which the submission's identity record remembers from the last admission, has no "
                "MultiKueueCluster any more (removed from the manager), so its pods cannot be read: nothing proves "
                f"the previous execution's pods there have stopped; once they are gone (the worker decommissioned, "
                f"or its pods of this object deleted there), confirm it with `dispatch admin worker-down {worker}`, "
                "which makes the identity records forget it")
    return (f"worker {worker} cannot be read ({problem}): nothing proves the previous execution's pods there "
            f"have stopped; if it is down, confirm it with `dispatch admin worker-down {worker}`")


def armed_for_start(trainjob: TrainJobView, record: RecordView) -> bool:
    """Whether a Kueue-mode object is raised for a start Kueue is about to make: suspended with the record's A,
    its token naming a raise made no more than ``KUEUE_WRITES_SINCE_RAISE`` spec writes ago. Raising the record
    under it would make the guard refuse that start for good (the check is already Ready)."""
    _, sep, gen = trainjob.token.rpartition("/")
    if not trainjob.suspended or trainjob.admission != record.admission or not sep or not gen.isdigit():
        return False
    return 1 <= (trainjob.ref.generation or 0) - int(gen) <= KUEUE_WRITES_SINCE_RAISE


def across(local: Verdict, workers: Sequence[WorkerVerdict]) -> Verdict:
    """The rule over a fleet: what remains here and in every worker the previous execution may have run
    in, each worker's pods named ``<worker>/<pod>``; a worker that cannot be read blocks unless it was
    confirmed down.

    A worker's pod whose end is proven (its node out-of-service; a deletion read here, without the
    Node's last state, proves nothing) does not count: here such a
    pod waits only for dispatch's controller to remove dispatch's finalizer, but no dispatch controller
    runs in a worker (the manager's only reads it), so there it would wait for good."""
    remaining = list(local.remaining)
    blockers = list(local.blockers)
    for w in sorted(workers, key=lambda w: w.worker):
        if w.verdict is not None:
            remaining.extend(replace(p, cluster=w.worker) for p in w.verdict.remaining if not p.proven)
            blockers.extend(f"worker {w.worker}: {b}" for b in w.verdict.blockers)
        elif not w.confirmed_down:
            blockers.append(unreadable_text(w.worker, w.problem, removed=w.removed))
    return Verdict(tuple(remaining), tuple(blockers))


def fleet_workers(trainjob: TrainJobView, record: RecordView | None, workers: Collection[str],
                  seen: Mapping[str, WorkerVerdict]) -> list[WorkerVerdict]:
    """Which workers' verdicts count for an object under MultiKueue: every worker Kueue knows and every one its
    identity record remembers (where the previous execution may have run; Kueue forgot it at the eviction). A
    worker that cannot be read counts only for an object that ran before (A issued): a first execution has
    nothing anywhere to wait for, and a pod found in a readable worker counts either way."""
    ran = max(record.admission if record is not None else 0, trainjob.admission) > 0
    mine = set(workers) | set(record.clusters if record is not None else ())
    return [seen[w] for w in sorted(mine) if w in seen and (seen[w].verdict is not None or ran)]


def admission_verdict(local: Verdict, trainjob: TrainJobView, record: RecordView | None,
                      workers: Collection[str] | None = None, seen: Mapping[str, WorkerVerdict] | None = None
                      ) -> Verdict:
    """The verdict an admission goes by: the rule over this cluster's read (``local``) and, under MultiKueue
    (``workers``: the workers Kueue knows; ``seen``: what each showed), over every worker that counts."""
    if workers is None or seen is None:
        return local
    return across(local, fleet_workers(trainjob, record, workers, seen))


def release_step(trainjob: TrainJobView, workload: WorkloadView | None) -> str:
    """What a plain ``release`` does with an object as read: ``running`` (nothing to admit: at most a hold Kueue
    has not acted on is undone), ``finished`` (refused: a new submission runs again), ``kueue`` (a Workload owns
    it, with or without the queue-name label: its ``active`` flag is the hold, and Kueue admits through
    dispatch's check) or ``admit``."""
    if trainjob.state is State.RUNNING:
        return "running"
    if trainjob.state in (State.SUCCEEDED, State.FAILED, State.CLOSING):
        return "finished"
    return "kueue" if trainjob.queue or workload is not None else "admit"


def release_reads(trainjob: TrainJobView) -> bool:
    """Whether a plain release reads the object's lower layers, record and runtime: not for one that runs or has
    ended, which ``release_step`` answers from the TrainJob (and its Workload) alone."""
    return release_step(trainjob, None) not in ("running", "finished")


def dispatch_refusal(trainjob: TrainJobView) -> tuple[str, str] | None:
    """Why a verb that admits or holds leaves the object alone (message, reason): not dispatch's, or fields
    dispatch owns that do not parse; None for an object it may act on."""
    if not trainjob.labelled:
        return f"trainjob {trainjob.name} is {unmanaged_text(trainjob)}", "NotDispatchObject"
    if trainjob.problems:
        return f"trainjob {trainjob.name} cannot be admitted: {'; '.join(trainjob.problems)}", "InvalidObject"
    return None


def finished_text(trainjob: TrainJobView, jobset: JobSetView | None = None) -> str:
    return (copied_end_text(trainjob, jobset)
            or f"trainjob {trainjob.name} is {trainjob.state.value.lower()}; open a new submission to run again")


COPIED_END = "is not this TrainJob's own"
"""The words that mark a Complete or Failed condition an earlier TrainJob's JobSet lent this one."""


def copied_end_text(trainjob: TrainJobView, jobset: JobSetView | None) -> str | None:
    """Why a TrainJob that reports Complete or Failed has not run, and the way out; or None.

    Trainer v2.3 copies the Complete and Failed conditions of the JobSet *of the TrainJob's name* into the
    TrainJob's status, whoever owns that JobSet, with the JobSet's own ``lastTransitionTime``; Kueue then
    declares the Workload finished. An earlier TrainJob's finished JobSet that the garbage collector left (a
    close, a kube-apiserver restart, a re-open under the name) so makes the new TrainJob look Succeeded or
    Failed before it ran (reproduced on the real control plane, issue 34). Complete is never taken back: Trainer
    builds nothing for a finished TrainJob, and Kueue never admits a finished Workload; only a new TrainJob runs.
    Two signs, either enough, neither a clock: the JobSet of the name is controlled by another TrainJob uid, or
    (that JobSet since deleted) no execution of this TrainJob was ever admitted (it carries no A, and nothing of
    an object dispatch opened starts without one; a labelled TrainJob dispatch did not open may run under Kueue
    with none, so that sign is not read for it)."""
    if trainjob.state not in (State.SUCCEEDED, State.FAILED) or not trainjob.labelled:
        return None
    condition = "Complete" if trainjob.complete else "Failed"
    name = trainjob.name
    after = (f"then `dispatch close {name}` and open it again (Trainer builds nothing for a TrainJob that reports "
             f"{condition}, and Kueue never admits its Workload again; a new TrainJob runs, and the submission's A "
             "goes on)")
    uid = trainjob.ref.uid
    if jobset is not None and jobset.owner_uid and uid and jobset.owner_uid != uid and not jobset.deleting:
        return (f"trainjob {name} reports {condition}, but the condition {COPIED_END}: Trainer v2.3 copied it from "
                f"jobset {jobset.name}, which {ORPHANED} of this name (uid {jobset.owner_uid}), deleted since, not "
                f"to this one (uid {uid}); this TrainJob has not run. The garbage collector missed that owner's "
                f"deletion (seen after a kube-apiserver restart) and never removes it: delete them, "
                f"{orphan_removal(jobset.name)}, {after}")
    if trainjob.admission == 0 and trainjob.dispatch_object:   # a TrainJob dispatch did not open may run with no A
        dated = f" (dated {trainjob.ended_at.isoformat()})" if trainjob.ended_at is not None else ""
        return (f"trainjob {name} reports {condition}{dated}, though no execution of it was ever admitted (it "
                f"carries no A): the condition {COPIED_END} (Trainer v2.3 copies it from the JobSet of the "
                f"TrainJob's name, here an earlier TrainJob's, deleted since), and this TrainJob has not run; "
                f"{after}")
    return None


def _job_blocker(job: JobView) -> str | None:
    """A child Job that could still start pods: not suspended, or its suspension not yet acted on.

    ``spec.suspend: true`` alone proves nothing: a Job unsuspended and suspended again before the Job
    controller synced it looks exactly like that, and the controller may still create pods from its
    cached copy after dispatch's read. Only the Job controller's own ``Suspended`` condition does.
    """
    if job.finished:
        return None
    if not job.suspended:
        return f"job {job.name} is not suspended yet"
    if job.suspended_confirmed:
        return None
    return f"job {job.name} {UNCONFIRMED}"


UNCONFIRMED = "has not confirmed its suspension yet"


def only_unconfirmed(verdict: Verdict) -> bool:
    """Whether every blocker is a child Job that has not yet acknowledged its suspension (no pod remains)."""
    return not verdict.remaining and bool(verdict.blockers) and all(b.endswith(UNCONFIRMED) for b in verdict.blockers)


def decide(
    *,
    name: str,
    job_id: str,
    submission: str,
    pods: Iterable[PodView],
    nodes: Mapping[str, NodeView],
    jobset: JobSetView | None = None,
    jobs: Iterable[JobView] = (),
    kin_jobsets: Iterable[JobSetView] = (),
    kin_jobs: Iterable[JobView] = (),
    uid: str = "",
) -> Verdict:
    """The rule. ``pods`` is everything one consistent read returned for both selections.

    A pod blocks unless its kubelet confirmed its end (Succeeded or Failed, every container terminated;
    a Failed phase written by PodGC or Kueue onto a pod of an unreachable node proves nothing). A JobSet
    or child Job whose suspension has not
    taken effect blocks too: it could still start a pod after the read (the suspended TrainJob alone
    does not prove the layers below have caught up). ``uid`` is the TrainJob's: a JobSet of its name owned
    by another uid is an earlier TrainJob's that the garbage collector left, and its blocker says so and
    names the way to remove it (nothing else ends that wait).
    """
    views = object_pods(pods, name=name, job_id=job_id, submission=submission)
    blockers: list[str] = []
    if jobset is not None and not (jobset.deleting or jobset.suspended or jobset.finished):
        orphan = orphaned_jobset_text(jobset, uid)
        blockers.append(orphan or f"jobset {jobset.name} is not suspended yet")
    for job in sorted(jobs, key=lambda j: j.name):
        if job.jobset_name != name:
            continue
        blocker = _job_blocker(job)
        if blocker:  # an earlier JobSet's Job no one will suspend: say so, and the way out
            blockers.append(orphaned_job_text(job, jobset) or blocker)
    blockers.extend(kin_blockers(name, kin_jobsets, kin_jobs))
    return Verdict(remaining(views, nodes), tuple(blockers))


KIN = "of the same submission under trainjob"

ORPHANED = "belongs to an earlier TrainJob"
"""The words that mark a JobSet left behind by its deleted owner (the campaign runner acts on them)."""


def orphan_removal(name: str) -> str:
    """The action that ends the wait on an earlier TrainJob's layers: delete them, as the garbage collector
    would have. The snapshot ConfigMap exists on Trainer v2.3 only, hence ``--ignore-not-found``."""
    return (f"`kubectl delete jobset/{name} configmap/{name}-runtime-snapshot --ignore-not-found` in the "
            "object's namespace (by someone who may delete JobSets: Kubernetes' edit role may not unless JobSet's "
            "install adds it; their pods stay under dispatch's rule until each one's end is proven)")


def orphaned_jobset_text(jobset: JobSetView, uid: str) -> str | None:
    """Why a JobSet named as this TrainJob but owned by another uid never goes by itself, and the action; or None.

    A TrainJob's name is unique in its namespace, so a JobSet whose controller is a TrainJob of this name with
    another uid has an owner that no longer exists: the garbage collector should have deleted it. On the real
    control plane it did not (issue 34: a TrainJob deleted 1 s before a kube-apiserver restart and re-created
    under the same name 40 s later; the collector's informer, back after the restart, saw the name with a new
    uid as an update and never learnt of the deletion), and Trainer refuses to build the new TrainJob's layers
    while the old ones exist (Trainer v2.3: Warning Event ``TrainJobResourcesCreationFailed``, "a snapshot
    configmap exists but is owned by another object"). dispatch does not delete them itself: its roles hold no
    delete on JobSets or ConfigMaps, and no RBAC rule narrows a ConfigMap delete to Trainer's snapshots."""
    if not uid or not jobset.owner_uid or jobset.owner_uid == uid or jobset.deleting:
        return None
    state = ("has finished" if jobset.finished else "is suspended" if jobset.suspended
             else "is not suspended and could still start pods")
    return (f"jobset {jobset.name} {ORPHANED} of this name (uid {jobset.owner_uid}), deleted since, not to this one "
            f"(uid {uid}), and {state}: the garbage collector normally removes it within seconds, but if it stays "
            "the collector missed its owner's deletion (seen after a kube-apiserver restart) and never will, and "
            "Trainer refuses to build this TrainJob's layers while the old ones exist (Warning Event "
            "TrainJobResourcesCreationFailed: a snapshot configmap exists but is owned by another object); "
            f"delete them: {orphan_removal(jobset.name)}")


ORPHANED_JOB = "belongs to an earlier JobSet"
"""The words that mark a child Job left behind by its deleted JobSet (the campaign runner acts on them too)."""


def orphaned_job_text(job: JobView, jobset: JobSetView | None) -> str | None:
    """Why a child Job named for this JobSet but not controlled by it keeps it from running; or None.

    JobSet names each child Job after itself (``<jobset>-<replicatedJob>-<index>``), so a Job an earlier
    JobSet of the name left behind takes the name the current JobSet's Job needs: JobSet's create of it is
    refused (AlreadyExists), JobSet reports a Warning Event ``JobCreationFailed`` and retries for ever, and the
    execution never starts. JobSet never adopts such a Job (v0.11 and v0.12 find their Jobs by the controller
    owner's uid), nor one with no owner at all (orphaned by ``--cascade=orphan``). Seen on the real control
    plane (issue 34, the two-hour campaign): 4 minutes after kube-apiserver restarts the garbage collector had
    not removed such a Job, its owner long gone. A Job made after the JobSet read is not called an earlier
    one's (a read that raced a re-creation)."""
    state = ("has finished" if job.finished else "is suspended" if job.suspended
             else "is not suspended and could still start pods")
    if jobset is None and job.owner_uid and not (job.finished or job.suspended):
        # no JobSet of the name at all: its owner is gone, and nothing will ever suspend it (seen in a MultiKueue
        # worker, where MultiKueue deletes a copy rather than suspending it)
        return (f"job {job.name} {ORPHANED_JOB} of this name (uid {job.owner_uid}) that no longer exists, and "
                f"{state}: nothing will suspend it; the garbage collector normally removes it within seconds, but if "
                "it stays it missed its owner's deletion (seen after a kube-apiserver restart); delete it: "
                f"{job_removal(job.name)}")
    if (jobset is None or jobset.deleting or not jobset.uid or job.owner_uid == jobset.uid
            or job.jobset_name != jobset.name):
        return None
    if job.created is not None and jobset.created is not None and job.created > jobset.created:
        return None
    whose = (f"{ORPHANED_JOB} of this name (uid {job.owner_uid}), deleted since," if job.owner_uid
             else f"has no owner: it {ORPHANED_JOB} of this name, orphaned, and belongs")
    return (f"job {job.name} {whose} not to this one (uid {jobset.uid}), and {state}: JobSet cannot create this "
            "JobSet's job of that name while it exists (Warning Event JobCreationFailed: already exists), so the "
            "execution's pods are never made; the garbage collector normally removes an earlier JobSet's Job "
            "within seconds, but if it stays it missed its owner's deletion (seen after a kube-apiserver restart); "
            f"delete it: {job_removal(job.name)}")


def job_removal(name: str) -> str:
    """The action that ends the wait on an earlier JobSet's child Job: delete it, as the collector would have."""
    return (f"`kubectl delete job/{name}` in the object's namespace (by someone who may delete Jobs, as Kubernetes' "
            "edit role may; its pods stay under dispatch's rule until each one's end is proven)")


def orphaned_jobs_text(jobset: JobSetView | None, jobs: Iterable[JobView]) -> str | None:
    """``orphaned_job_text`` for every child Job of the JobSet's name, joined; or None."""
    said = [t for t in (orphaned_job_text(j, jobset) for j in sorted(jobs, key=lambda j: j.name)) if t]
    return "; ".join(said) or None


BUILD_FAILED = "TrainJobResourcesCreationFailed"
"""The reason of Trainer's Warning Event when it could not build a TrainJob's JobSet (v2.3: the only report)."""

SNAPSHOT_OWNED = "a snapshot configmap exists but is owned by another object"
"""Trainer v2.3's words when the runtime snapshot ConfigMap ``<name>-runtime-snapshot`` of an earlier TrainJob
of the name is still there."""


def unbuilt_text(trainjob: TrainJobView, events: Iterable[EventView]) -> str | None:
    """Why Trainer built no JobSet for this TrainJob, from its newest build failure Event; or None.

    Trainer v2.3 keeps a snapshot of the runtime in a ConfigMap owned by the TrainJob and refuses to build a
    TrainJob whose snapshot ConfigMap is owned by another uid: an earlier TrainJob of the same name, deleted,
    whose ConfigMap the garbage collector has not removed (seen on the real control plane, issue 34: 4 minutes
    after kube-apiserver restarts). It says so only in a Warning Event on the TrainJob, so an execution that
    dispatch admitted (nothing of the earlier one may run) never starts and nothing in the object says why.
    dispatch does not delete the ConfigMap itself: its roles read no ConfigMap but its own ledger."""
    failed = [e for e in events if e.reason == BUILD_FAILED]
    if not failed:
        return None
    newest = max(failed, key=lambda e: e.last or 0.0)
    what = f"Trainer has built no JobSet for trainjob {trainjob.name}"
    if SNAPSHOT_OWNED in newest.message:
        return (f"{what}: its runtime snapshot configmap {trainjob.name}-runtime-snapshot {ORPHANED} of this name, "
                f"deleted since, not to this one (uid {trainjob.ref.uid}) (Warning Event {BUILD_FAILED}: "
                f"{SNAPSHOT_OWNED}); the garbage collector normally removes it within seconds, but if it stays it "
                "missed its owner's deletion (seen after a kube-apiserver restart); delete it: "
                f"{orphan_removal(trainjob.name)}")
    return f"{what} (Warning Event {BUILD_FAILED}): {newest.message[:400]}"


def kin_blockers(name: str, jobsets: Iterable[JobSetView], jobs: Iterable[JobView]) -> list[str]:
    """The layers of the submission under another TrainJob name that could still start a pod.

    A ``close`` deletes its TrainJob in the background: its JobSet and Jobs stay until garbage collection
    reaches them, and a Job that is not suspended makes pods (a replacement of a failed one, say) that a
    re-opened object's admission would not wait for. They are judged as the object's own layers are: a JobSet
    not suspended, a Job whose suspension has not taken effect, blocks until it is gone, finished or
    suspended. (The choice over refusing while any layer of the submission exists at all: a suspended layer
    whose owner is gone cannot start anything, and waiting on it would stall a re-open for as long as
    garbage collection lags.)"""
    out = []
    for js in sorted(jobsets, key=lambda j: j.name):
        if js.name != name and not (js.deleting or js.suspended or js.finished):
            out.append(f"jobset {js.name} {KIN} {js.name} (not this one) is not suspended yet (a closed object's "
                       "layers stay until garbage collection removes them; should it stay, the collector missed "
                       f"its owner's deletion, as after a kube-apiserver restart: {orphan_removal(js.name)})")
    for job in sorted(jobs, key=lambda j: j.name):
        if job.jobset_name == name:
            continue
        blocker = _job_blocker(job)
        if blocker:
            blockers_text = blocker.replace(f"job {job.name} ", f"job {job.name} {KIN} {job.jobset_name} ", 1)
            out.append(blockers_text + " (a closed object's layers stay until garbage collection removes them)")
    return out


def cessation(
    *,
    trainjob: TrainJobView | None,
    name: str,
    job_id: str,
    submission: str,
    pods: Iterable[PodView],
    nodes: Mapping[str, NodeView],
    jobset: JobSetView | None = None,
    jobs: Iterable[JobView] = (),
    kin_jobsets: Iterable[JobSetView] = (),
    kin_jobs: Iterable[JobView] = (),
) -> Cessation:
    """Whether the object's processes are proven gone.

    True once the object is not admitted and every pod's end is proven: confirmed by its kubelet, or its
    Node tainted out-of-service and not Ready, or deleted while last seen Ready=Unknown (known only to a
    watcher: the controller), or deleted before it was ever scheduled. A Node that could
    not be read proves nothing, and neither does a Failed phase its kubelet did not report. ``ends`` says
    per pod how. The layers below are judged as the rule judges them: a JobSet or child Job that has not
    acted on the suspension could still start a pod, so nothing has ceased while one lags.
    """
    views = object_pods(pods, name=name, job_id=job_id, submission=submission)
    rest = remaining(views, nodes)
    proofs = ends(views, nodes)
    admitted = trainjob is not None and not trainjob.suspended and not trainjob.deleting
    if admitted and trainjob is not None and not trainjob.complete and not trainjob.failed:
        # a rank whose pod is being deleted (its Job re-created, its namespace going) waits on that pod's end:
        # say so and name the action, as status does, rather than only "running"
        waiting = [waiting_ranks_text(trainjob, views, nodes),
                   nonindexed_text(f"trainjob {name}", jobs_nonindexed(jobs, name), running=True)]
        why = "; ".join(w for w in waiting if w)
        return Cessation(False, f"{name} is admitted and running" + (f"; {why}" if why else ""), rest, proofs)
    lagging = decide(name=name, job_id=job_id, submission=submission, pods=(), nodes=nodes, jobset=jobset,
                     jobs=jobs, kin_jobsets=kin_jobsets, kin_jobs=kin_jobs,
                     uid=trainjob.ref.uid if trainjob is not None else "").blockers
    if lagging and not (trainjob is not None and (trainjob.complete or trainjob.failed)):
        return Cessation(False, "a layer below could still start a pod: " + "; ".join(lagging), rest, proofs)
    open_ends = {e.name for e in proofs if not e.proven}
    unproven = [p for p in rest if p.name in open_ends]
    if not unproven:
        if rest:
            return Cessation(True, "every remaining pod is on a node that is gone or out-of-service", rest, proofs)
        return Cessation(True, "no pod of the object may still run", rest, proofs)
    unreadable = [p for p in unproven if p.node_state == "not readable"]
    if unreadable:
        return Cessation(
            False,
            "cannot prove cessation: nodes not readable (needs get on nodes): "
            + describe_pods(unreadable),
            rest, proofs,
        )
    reason = "pods may still run: " + describe_pods(unproven)
    why = why_text(unproven)
    if why:
        reason += "; " + why
    unconfirmed = [p for p in unproven if p.phase in TERMINAL_PHASES and not p.why and not p.held]
    if unconfirmed:
        reason += ("; a Failed or Succeeded phase not reported by the pod's kubelet proves nothing: "
                   + ", ".join(p.name for p in unconfirmed))
    stuck = stuck_text(unproven)
    if stuck:
        reason += "; " + stuck
    return Cessation(False, reason, rest, proofs)


# --------------------------------------------------------------------------- pod replacement


REPLACEMENT_RISK = ("the Job controller then starts a replacement as soon as a pod is deleting, so a pod on a lost "
                    "node can run beside its replacement, two processes of one rank with one A; set "
                    "podReplacementPolicy: Failed in the runtime's Job template (Trainer's runtime patches cannot "
                    "set it)")


def runtime_replacement_warning(kind: str, name: str, policies: Mapping[str, str]) -> str | None:
    """Warn when a runtime's replicatedJobs do not set ``podReplacementPolicy: Failed``."""
    unsafe = sorted(rj for rj, policy in policies.items() if policy != "Failed")
    if not unsafe:
        return None
    return (f"{kind} {name}: replicatedJob{'s' if len(unsafe) > 1 else ''} {', '.join(unsafe)} "
            f"{'do' if len(unsafe) > 1 else 'does'} not set podReplacementPolicy: Failed; " + REPLACEMENT_RISK)


KEEPER_GRACE_SECONDS = 60.0
"""How long after its deletion a pod whose end is proven may still carry dispatch's finalizer before status
says the controller is not freeing it (its keeper does within seconds while it runs)."""


def keeper_idle_warning(pods: Iterable[PodView], nodes: Mapping[str, NodeView], now: float,
                        after: float = KEEPER_GRACE_SECONDS) -> str | None:
    """Pods deleted over ``after`` seconds ago whose end is proven but that still carry dispatch's finalizer:
    only dispatch's controller removes it on its own, so it is not running for this namespace (or cannot
    write there). ``now`` is the API server's clock (the Date of its answer), the one its deletion times are
    on; a hint's timing only, nothing is decided by it."""
    late: list[tuple[str, str]] = []
    for p in pods:
        deleted = instant(p.deletion_timestamp)
        if not p.ours or deleted is None or now - deleted < after:
            continue
        end = p.end(nodes.get(p.node) if p.node else None)
        if end in PROVEN:
            late.append((p.name, f"{p.name} ({end}, deleted {int(now - deleted)}s ago)"))
    if not late:
        return None
    late.sort()
    first = late[0][0]
    return (f"pods whose end is proven still carry dispatch's finalizer {POD_FINALIZER}: "
            f"{', '.join(text for _, text in late)}; only dispatch's controller removes it by itself, within "
            "seconds while it runs, so it is not running for this namespace (runbook: The controller is down); "
            "until it is back, the object's next release, open or close frees them, or a dispatch-admin runs "
            f"`dispatch admin release-pod {first}` for each")


def runtime_restarts_warning(kind: str, name: str, found: Iterable[tuple[str, str, str]]) -> str | None:
    """Warn when a runtime's containers set their own restart policy or rules (ContainerRestartRules, 1.35+):
    their kubelet restarts them inside the same pod whatever the pod's restartPolicy, so dispatch reads each
    container's own policy where it judges a pod's end. The promise holds (a restart runs the same execution,
    its A unchanged); what it costs is the proof of a Failed written by someone other than the kubelet (Kueue's
    failure recovery, PodGC): none for such a container, so a lost node's pods wait for the node to be
    confirmed down."""
    listed = [f"{job}/{container} ({what})" for job, container, what in found]
    if not listed:
        return None
    return (f"{kind} {name}: container{'s' if len(listed) > 1 else ''} {', '.join(listed)} "
            f"{'set their' if len(listed) > 1 else 'sets its'} own restart policy or rules, so its kubelet restarts "
            "it inside the same pod whatever the pod's restartPolicy (the same execution, its A unchanged); a "
            "Failed written by someone other than its kubelet (Kueue's failure recovery, PodGC) proves nothing "
            "for it, so a lost node's pods wait until the node is confirmed down (docs: cessation)")


def jobs_replacement_warning(jobs: Iterable[JobView], name: str) -> str | None:
    """Warn when a child Job of the object replaces deleting pods at once (TerminatingOrFailed)."""
    unsafe = sorted(f"{j.name} ({j.replacement_policy or 'unset'})" for j in jobs
                    if j.jobset_name == name and not j.finished and j.replacement_policy != "Failed")
    if not unsafe:
        return None
    return f"podReplacementPolicy is not Failed on job {', '.join(unsafe)}; " + REPLACEMENT_RISK


def nonindexed_text(where: str, jobs: Mapping[str, int], *, running: bool = False) -> str | None:
    """Why dispatch does not run these NonIndexed replicatedJobs (name -> parallelism), or None (issue 35 item 6).

    A NonIndexed Job's pods carry no completion index, so the pod guard cannot tell a second pod of the Job,
    which the Job controller makes while active < parallelism, from a replacement of a pod that may still run,
    which it makes once that pod is deleting or failed (a kubelet back from a cut can even write Running over
    such a Failed); counting the rank as the same, it would refuse every pod beyond the first while that runs.
    ``running``: the object already runs (said by status, ceased): the guard refuses the Job's other pods."""
    if not jobs:
        return None
    listed = ", ".join(f"replicatedJob {j} (completionMode: NonIndexed, parallelism {p})"
                       for j, p in sorted(jobs.items()))
    effect = ("the guard refuses every pod of such a Job beyond the one that runs" if running
              else "dispatch's guard would refuse every pod of such a Job beyond the first while that one runs")
    return (f"{where}: {listed}: the pods of a NonIndexed Job carry no completion index, so a second pod of the Job "
            f"cannot be told from a replacement of one that may still run and {effect}; set completionMode: Indexed "
            "(JobSet's default) on that replicatedJob's Job template, or parallelism 1")


def jobs_nonindexed(jobs: Iterable[JobView], name: str) -> dict[str, int]:
    """The object's child Jobs that are NonIndexed with parallelism above 1: replicatedJob -> parallelism."""
    return {j.replicated_job or j.name: j.parallelism for j in jobs
            if j.jobset_name == name and not j.finished and j.completion_mode == "NonIndexed" and j.parallelism > 1}


# --------------------------------------------------------------------------- admission numbers


@dataclass(frozen=True)
class Plan:
    """Which A an admission carries and which writes it still needs."""

    admission: int
    write_record: bool
    """Issue A in the identity record (always before the TrainJob carries it)."""
    write_trainjob: bool
    """Raise A on the TrainJob and in dispatch's runtime patch entry."""


def carried(trainjob: TrainJobView, pods: Iterable[PodView]) -> int:
    """The highest A the object or any of its pods carries: every A that can have run."""
    return max([trainjob.admission, trainjob.patch_admission, *(p.admission or 0 for p in pods)])


def close_record(trainjob: TrainJobView, record: RecordView | None, pods: Iterable[PodView]) -> str | None:
    """What ``close`` does with the submission's identity record before it deletes the object, so a re-opened
    submission goes on counting: ``"lift"`` the record this object holds (to the highest A it carried, and the
    floor's), ``"create"`` one for an object opened before records that carried an A (so its A is kept), or
    None: the record is another object's (or there is none and nothing ran), and close leaves it."""
    if not trainjob.labelled:
        return None
    if record is not None:
        return "lift" if record.trainjob == trainjob.name else None
    return "create" if carried(trainjob, pods) > 0 else None


def next_admission(trainjob: TrainJobView, pods: Iterable[PodView], record: RecordView | None = None,
                   *, own: Collection[str] = (), plain: bool = True) -> Plan:
    """The A of the admission being made, raised exactly once per admission.

    * The record issued an A to this very TrainJob (its uid) that neither it nor any pod carries: that A
      never ran (an A is carried by the TrainJob before anything can start with it), so this admission
      takes it. An A issued to an earlier object of the submission may have run: never taken again.
    * The TrainJob carries the record's A with a token in ``own``: this admission's own raise, found on
      retry (plain mode: the call's token; Kueue mode: the Workload's uid and the TrainJob generation
      the raise was made on, which holds only while nothing changed the TrainJob's spec since, so an
      admission Kueue started and evicted never matches).
    * Plain mode, the TrainJob carries the record's A but dispatch's unsuspend never started it and no
      pod carries it: that admission was armed and never started (a lost reply, a concurrent release),
      so this one takes it rather than skip a number.
    * Otherwise one above everything seen. Never reused: a number is skipped only when a writer dies
      between issuing it and starting it in a way none of the cases above can see.
    """
    pods = list(pods)
    seen = carried(trainjob, pods)
    issued = record.admission if record is not None else 0
    bind = record is not None and record.trainjob_uid != trainjob.ref.uid
    if record is not None and issued > seen and not bind:
        return Plan(issued, write_record=False, write_trainjob=True)
    if record is not None and issued > 0 and trainjob.admission == issued == trainjob.patch_admission and not bind:
        if trainjob.token and trainjob.token in own:
            return Plan(issued, write_record=False, write_trainjob=False)
        pods_a = max([0, *(p.admission or 0 for p in pods)])
        if plain and trainjob.started < issued and pods_a < issued:
            return Plan(issued, write_record=False, write_trainjob=False)
    return Plan(max(seen, issued) + 1, write_record=True, write_trainjob=True)


def exhausted_text(job_id: str, submission: str, issued: int) -> str:
    """Why a submission can number no new execution: it has been issued ``ADMISSION_LIMIT`` (only a floor or
    record raised there by hand gets so far), and the one way out."""
    return (f"{job_id}/{submission} has been issued A={issued}, the highest A dispatch issues: no new execution "
            f"of it can be numbered; `dispatch admin forget {job_id} {submission} --yes` (an admin's decision, "
            "once the object is closed, no process of it can run and nothing fences on its old numbers) makes it "
            "count from 1 again, or open a new submission")


def plan_problem(trainjob: TrainJobView, plan: Plan) -> str | None:
    """Why the admission ``plan`` says cannot be made, or None: a new A above ``ADMISSION_LIMIT`` is never
    issued (the CRDs refuse to store it, and no A may be issued twice)."""
    if plan.write_record and plan.admission > ADMISSION_LIMIT:
        return exhausted_text(trainjob.job_id, trainjob.submission, plan.admission - 1)
    return None


def record_problem(trainjob: TrainJobView, record: RecordView | None, pods: Iterable[PodView]) -> str | None:
    """Why the identity record cannot be trusted for this object, or None.

    Never read as 0: a missing record of a submission that has run, one that does not parse, or one
    that names another submission or object, is refused, naming the record. (Lowering a record in place
    is refused by the API server itself, through the CRD's rule; a record below what the object or its
    pods carry is lifted above them by the next admission, never reused.)
    """
    pods = list(pods)
    seen = carried(trainjob, pods)
    ident = f"{trainjob.job_id}/{trainjob.submission}"
    if record is None:
        if seen > 0:
            return (f"{describe_missing(trainjob.job_id, trainjob.submission)} of {ident} is missing, but "
                    f"trainjob {trainjob.name} has run as A={seen}; dispatch will not guess the next A "
                    "(restore the record from a backup, or close this object, which records the highest A it "
                    "and its pods carry, and open the submission again)")
        return None
    if record.problems:
        return f"{record.describe()} of {ident} does not parse: {'; '.join(record.problems)}"
    if (record.job_id, record.submission) != (trainjob.job_id, trainjob.submission):
        return (f"{record.describe()} names {record.job_id}/{record.submission}, not {ident}; "
                "it was edited by someone else")
    if close_begun(trainjob, record):
        return close_again_text(trainjob.name)
    if record.trainjob != trainjob.name or (record.trainjob_uid and record.trainjob_uid != trainjob.ref.uid):
        holder = record.trainjob or "no trainjob (closed)"
        return (f"submission {ident} is held by {holder}, not by trainjob {trainjob.name} "
                f"({record.describe()}); open a new submission instead")
    return None


# --------------------------------------------------------------------------- claiming a submission


@dataclass(frozen=True)
class Claim:
    """What an ``open`` does with a submission's record: ``create`` it, ``resume`` the same open's claim,
    ``take`` it over from a holder that is gone, or nothing, ``refusal`` (message, reason) saying why."""

    action: str
    refusal: tuple[str, str] | None = None


def claim_refusal_of_record(record: RecordView, job_id: str, submission: str) -> tuple[str, str] | None:
    """A record that does not parse, or names another submission, is never claimed (or trusted)."""
    if record.problems or (record.job_id, record.submission) != (job_id, submission):
        return (f"{record.describe()} of {job_id}/{submission} cannot be trusted: "
                f"{'; '.join(record.problems) or 'it names another submission'}", "RecordInvalid")
    return None


def claim_held(record: RecordView | None, holder: TrainJobView | None) -> bool:
    """Whether the record's holder still exists as the object it was bound to."""
    return (record is not None and holder is not None
            and (not record.trainjob_uid or holder.ref.uid == record.trainjob_uid))


def claim(job_id: str, submission: str, trainjob: str, record: RecordView | None, holder: TrainJobView | None,
          other: TrainJobView | None) -> Claim:
    """How ``open`` of ``trainjob`` claims a submission: only one caller can win it.

    ``record`` is the submission's record as read, ``holder`` the TrainJob it names (read only when it
    names one) and ``other`` any live TrainJob of the submission (read only when the record is missing
    or its holder is gone: the holder may have been edited). A new submission's record is created; an
    existing one is taken over only when its holder is gone (closed, or deleted after it had run); one
    held by a TrainJob that exists, or claimed by another name not created yet, is refused as
    AlreadyExists naming that object. Re-running the same open (same name) resumes its claim.
    """
    ident = f"{job_id}/{submission}"
    taken = f"submission {ident} already exists as trainjob {{}}; choose a new submission"
    if record is None:
        if other is not None:
            return Claim("", (taken.format(other.name), "AlreadyExists"))
        return Claim("create")
    invalid = claim_refusal_of_record(record, job_id, submission)
    if invalid is not None:
        return Claim("", invalid)
    held = claim_held(record, holder)
    if not held and other is not None and other.name != trainjob:
        return Claim("", (taken.format(other.name), "AlreadyExists"))
    if record.trainjob == trainjob and not held and not record.trainjob_uid:
        return Claim("resume")  # the same open again: its claim stands
    if held:
        return Claim("", (taken.format(record.trainjob), "AlreadyExists"))
    if record.trainjob and not record.trainjob_uid and holder is None:
        return Claim("", (f"submission {ident} already exists by an open of trainjob {record.trainjob} that has "
                          f"not created it yet (if that open failed, `dispatch close {record.trainjob}` releases "
                          "the claim); choose a new submission", "AlreadyExists"))
    return Claim("take")


# --------------------------------------------------------------------------- after a conflict


def start_refused_by_trainer(message: str) -> bool:
    """Whether a raise that also unsuspends was refused by Trainer's rule on runtime patches (before v2.2.1 they
    may change only in a write that leaves the TrainJob suspended): the cluster then takes them in two writes."""
    lowered = message.lower()
    return "runtimepatches" in lowered.replace(" ", "") and "suspended" in lowered


def unsuspend_still_holds(raised: TrainJobView, fresh: TrainJobView | None, admission: int) -> bool:
    """After a 409 on the unsuspend: does the decision still hold, so only the resourceVersion moved?

    Trainer writes the TrainJob's status right after it is created, so the unsuspend often meets a 409.
    If the TrainJob is still suspended, with our A and the same generation (no spec change since our
    raise, so no pod can have started since the consistent read), the unsuspend is retried as is.
    """
    return (fresh is not None and not fresh.deleting and fresh.suspended
            and fresh.ref.generation == raised.ref.generation and fresh.admission == admission)


def ready_conflict(fresh: WorkloadView | None, check: str, trainjob: TrainJobView | None, raised: TrainJobView,
                   admission: int, dispatch_object: bool) -> str | None:
    """After a 409 on the Ready write: None if the decision still holds (write again), else why not.

    Kueue touches Workloads often (conditions); what matters is that our check is still Pending on
    reserved quota and the TrainJob still suspended with no spec change since our own write.
    """
    if fresh is None:
        return "gone"
    entry = fresh.entry([check])
    if entry is None or entry.state != "Pending" or not_now(fresh):
        return "WorkloadChanged"
    if (trainjob is None or not trainjob.suspended or trainjob.deleting
            or trainjob.ref.generation != raised.ref.generation
            or (dispatch_object and trainjob.admission != admission)):
        return "TrainJobChanged"
    return None


def check_conflict(read: CheckEntry | None, uid: str, owner_uid: str, fresh: WorkloadView | None) -> str | None:
    """After a 409 on a write of our entry that admits nothing (a Pending message, a foreign Workload's Ready):
    None if it may be written again on ``fresh``, else why not.

    The resourceVersion such a write is conditioned on guards what its decision read of the Workload: our entry
    (``read``: no other writer, another replica's Ready or Kueue's reset at an eviction, changed it since), the
    Workload itself (``uid``, its owner) and Kueue's gating (``not_now``). Kueue rewriting its own fields meanwhile
    (conditions, other checks' entries) changes none of these, so the same write on the fresh version is as safe
    as it was on the one read; any other change and the Workload is decided afresh. Nothing of the lower layers is
    guarded by the Workload's version: the decision read those apart, and their changes requeue it."""
    if fresh is None:
        return "gone"
    owner = fresh.owner.uid if fresh.owner is not None else ""
    if (read is None or fresh.ref.uid != uid or owner != owner_uid or fresh.entry([read.name]) != read
            or not_now(fresh)):
        return "WorkloadChanged"
    return None


# --------------------------------------------------------------------------- Kueue gating


def not_now(workload: WorkloadView) -> str:
    """Why a Pending check is not ours to decide yet: Kueue decides checks only on reserved quota."""
    if workload.deleting:
        return "workload-deleting"
    if not workload.active:
        return "inactive"
    if workload.finished:
        return "finished"
    if not workload.quota_reserved:
        return "no-quota"
    if workload.evicted:
        return "evicting"
    return ""


def owner_refusal(owner: Owner, trainjob: TrainJobView | None) -> str | None:
    """Why a Workload's TrainJob cannot be decided for (an outcome name), or None."""
    if trainjob is None or (owner.uid and trainjob.ref.uid != owner.uid):
        return "owner-missing"
    if trainjob.deleting:
        return "owner-deleting"
    if not trainjob.suspended:
        return "owner-running"
    return None


# --------------------------------------------------------------------------- messages


def truncate(message: str) -> str:
    if len(message) <= MESSAGE_LIMIT:
        return message
    return message[: MESSAGE_LIMIT - 20].rsplit(", ", 1)[0] + ", ... (truncated)"


def waiting_text(verdict: Verdict) -> str:
    """The Pending message: the seed's exact form for pods, then the way out of a wait nothing of dispatch's ends
    (a pod held for good: ``stuck_text``; another controller's finalizer on a pod whose end is proven:
    ``FOREIGN_FINALIZER``, with its patch), then any JobSet/Job not yet suspended."""
    if verdict.remaining:
        stuck = stuck_text(verdict.remaining)
        foreign = why_text([p for p in verdict.remaining if FOREIGN_FINALIZER in p.why])
        return truncate(waiting_message(verdict.remaining, [*filter(None, (stuck, foreign)), *verdict.blockers]))
    return truncate("waiting for the previous execution to stop: " + "; ".join(verdict.blockers))


def delayed_event(check: str, message: str) -> str:
    return f"admission check {check} stays Pending: {message}"


def refused_text(trainjob: str, error: object) -> str:
    """The Pending message when raising A was refused (a webhook, RBAC, a bad record)."""
    return truncate(f"{WAITING_PREFIX}a writable admission number: raising A on trainjob {trainjob} "
                    f"was refused: {error}")


def failed_text(error: object) -> str:
    """The Pending message when a decision's read or write failed (an RBAC gap, an unreachable API)."""
    return truncate(f"{WAITING_PREFIX}dispatch's decision to succeed: {error}")


def record_text(problem: str) -> str:
    """The Pending message when the identity record cannot be trusted."""
    return truncate(f"{WAITING_PREFIX}a trustworthy identity record: {problem}")


def admitted_text(job_id: str, submission: str, admission: int) -> str:
    return f"no pod of the previous execution remains; admitted as {job_id}/{submission}#{admission}"


FOREIGN_READY_TEXT = ("no pod of a previous execution remains (not a dispatch object, so no admission "
                      "number is raised)")


def foreign_text(owner: Owner | None) -> str:
    what = f"{owner.kind} {owner.name}" if owner else "a Workload without a controller owner"
    return f"{what} is not a TrainJob: dispatch's rule covers TrainJobs only, so this check passes it"


def ready_event(check: str, message: str) -> str:
    return f"admission check {check} Ready: {message}"


STALE_EVICTION = ("Kueue is finishing the eviction of workload {workload}: it waits until trainjob {name}'s status "
                  "shows no active Job. Under MultiKueue that status is copied from the worker's copy, and "
                  "MultiKueue can delete the copy before its last status arrives (seen with Kueue v0.19.2): then "
                  "it never changes. Once no pod of {name} runs in any worker (`dispatch ceased {name}`), "
                  "`kubectl patch trainjob {name} --subresource=status --type=merge -p "
                  "'{{\"status\":{{\"jobsStatus\":[]}}}}'` lets Kueue finish")


KUEUE_NEVER_ADMITS = "Kueue never admits this TrainJob again"
"""The words that mark a Workload Kueue declared finished under a TrainJob that has not run (the campaign runner
closes and re-opens on them)."""

WORKLOAD_FINISHED = (
    "workload {workload} is Finished though trainjob {name} has not run to an end: {never} (Kueue finishes a "
    "Workload when its TrainJob reports Complete or Failed, and Trainer v2.3 copies those conditions from the JobSet "
    "of the TrainJob's name, which right after a re-open can still be an earlier TrainJob's that the garbage "
    "collector has not removed; seen on the real control plane at a re-open's creation, issue 34); "
    "`dispatch close {name}` and open it again (a new TrainJob gets a new Workload; the submission's A goes on)")
WORKLOAD_FINISHED = WORKLOAD_FINISHED.replace("{never}", KUEUE_NEVER_ADMITS)


def workload_note(workload: WorkloadView | None, trainjob: TrainJobView | None = None) -> str:
    """What a Workload's own state says about a wait, for status (held, waiting for quota, an eviction Kueue
    cannot finish)."""
    if workload is None:
        return ""
    if (trainjob is not None and trainjob.managed_by == "kueue.x-k8s.io/multikueue" and workload.evicted
            and workload.quota_reserved):
        return STALE_EVICTION.format(workload=workload.ref.name, name=trainjob.name)
    if (workload.finished and trainjob is not None and trainjob.state in (State.HELD, State.QUEUED)
            and trainjob.labelled):
        return WORKLOAD_FINISHED.format(workload=workload.ref.name, name=trainjob.name)
    if not workload.active:
        return "workload deactivated (held); release reactivates it"
    if not workload.quota_reserved:
        return f"waiting for quota: {workload.quota_message}".rstrip(": ")
    return ""


def unmanaged_text(trainjob: TrainJobView) -> str:
    who = f"created by {trainjob.created_by}" if trainjob.created_by else "not created by dispatch"
    return (f"not managed by dispatch ({who}, without dispatch's job-id/submission labels): it has no "
            "execution identity (no A), and dispatch does not hold or release it")


UNMANAGED_HINT = ("to bring such TrainJobs under dispatch, create them with `dispatch open` (or the library), or "
                  "in a namespace labelled dispatch.phpboyscout.uk/enrol=true "
                  "(docs: \"Objects and submissions\", \"Enrolled namespaces\")")


def unmanaged_cause(trainjob: TrainJobView, verdict: Verdict | None, check: CheckEntry | None) -> Cause:
    """The cause of a TrainJob dispatch does not manage: what it is, and what still applies to it."""
    parts = [unmanaged_text(trainjob)]
    if check is not None:
        parts.append(f"admission check {check.name} {check.state}" + (f": {check.message}" if check.message else ""))
    if verdict is not None and not verdict.admissible and trainjob.state is not State.RUNNING:
        parts.append(verdict.detail())
    return Cause("NotManaged", "; ".join(parts))


def close_begun(trainjob: TrainJobView, record: RecordView | None) -> bool:
    """Whether a ``dispatch close`` of this object released its submission's claim and did not delete it
    (interrupted between the two writes): the record, trustworthy and of this submission, names no holder."""
    return (record is not None and not record.problems and trainjob.labelled and not trainjob.deleting
            and (record.job_id, record.submission) == (trainjob.job_id, trainjob.submission)
            and not record.trainjob and not record.trainjob_uid)


def close_again_text(name: str) -> str:
    return (f"a `dispatch close` of trainjob {name} released its submission's claim and did not delete it (it "
            f"was interrupted), so nothing admits it again; `dispatch close {name}` again finishes the close, "
            "then open the submission again")


def explain(
    trainjob: TrainJobView, verdict: Verdict | None, check: CheckEntry | None = None, note: str = "",
    record: RecordView | None = None, stalled: str | None = None,
) -> Cause:
    """The cause shown by inspect and find. Not-running objects name whatever keeps them waiting; one whose
    close was interrupted names ``close`` again as its remedy (``record``: its submission's identity record);
    one whose JobSet Trainer can no longer update (``stalled_jobset_text``) names the way out."""
    state = trainjob.state
    if not trainjob.labelled:
        return unmanaged_cause(trainjob, verdict, check)
    if state in (State.HELD, State.QUEUED) and close_begun(trainjob, record):
        return Cause("CloseInterrupted", close_again_text(trainjob.name))
    if state in (State.HELD, State.QUEUED) and note.startswith(STALE_EVICTION[:30]):
        return Cause("EvictionUnfinished", note)  # Kueue's, not the check's: nothing is decided until it ends
    parts: list[str] = []
    if check is not None:
        out = f"admission check {check.name} {check.state}"
        if check.message:
            out += f": {check.message}"
        parts.append(out)
    elif note:
        parts.append(note)
    pods_text = verdict.detail() if verdict is not None and not verdict.admissible else ""
    if state is State.RUNNING:
        return Cause("Admitted", "; ".join([f"execution {trainjob.admission} admitted", *filter(None, [stalled])]))
    if pods_text:
        parts.append(pods_text)
    if stalled:
        parts.append(stalled)
    if state is State.HELD:
        if pods_text:
            return Cause("PodsRemain", "; ".join(parts))
        if note.startswith("waiting for quota") or (check is not None and not note):
            # No queue-name label, yet an active Workload of Kueue's owns it (manageJobsWithoutQueueName):
            # Kueue starts it, so "hold in force" would be false right after a release.
            return Cause("Queued", "; ".join([*parts, "Kueue manages it without a queue-name label: its Workload "
                                              "is active, and Kueue, not `release`, starts it"]))
        return Cause("Held", "; ".join([*parts, "hold in force; release admits it"]))
    if state is State.QUEUED:
        reason = "AdmissionCheckPending" if check is not None and check.state == "Pending" else "Queued"
        if not parts:
            parts.append(f"waiting for Kueue to admit it from queue {trainjob.queue}")
        return Cause(reason, "; ".join(parts))
    if state is State.SUCCEEDED:
        return Cause("Succeeded", "; ".join(parts))
    if state is State.FAILED:
        return Cause("Failed", "; ".join(parts))
    return Cause("Closing", "; ".join(parts))


# --------------------------------------------------------------------------- the guard (admission webhook)


def kueue_raise_token(workload_uid: str, generation: int | None) -> str:
    """The token of a Kueue-mode raise of A: the Workload's uid and the TrainJob generation the raise was
    made on: the controller writes it with the raise, the guard recognises it; both call this."""
    return f"{workload_uid}/{generation or 0}"


KUEUE_WRITES_SINCE_RAISE = 2
"""Spec writes a Kueue-mode start may follow its raise by: the raise itself, and Kueue's own write of the
pod set information into its runtime patch entry (Kueue writes that, suspended, before it unsuspends)."""


def _raised_on(token: str, workload_uid: str) -> int | None:
    """The generation a Kueue-mode raise of this Workload was made on, from its token (None: not one)."""
    head, sep, gen = token.rpartition("/")
    if not sep or head != workload_uid or not gen.isdigit():
        return None
    return int(gen)


def starts_execution(operation: str, old: TrainJobView | None, new: TrainJobView) -> bool:
    """A write that starts an execution: a create that is not suspended, or ``spec.suspend`` true to false."""
    if operation == "CREATE":
        return not new.suspended
    return operation == "UPDATE" and old is not None and old.suspended and not new.suspended


def identity_change(old: TrainJobView, new: TrainJobView) -> str | None:
    """Why an update of a dispatch TrainJob would undo what an admission relies on, or None.

    A (the annotation), the ``started`` mark and the A in dispatch's runtime patch entry only rise: a
    lowered or removed one would let an A that has run be started again. The identity labels and the
    entry itself stay: without them the pods of the next execution would not carry the identity the
    record counts for. The token changes only together with a raise of A: the Kueue-mode start check
    trusts it to say which spec generation A was raised on.
    """
    what = f"trainjob {new.name}"
    for label, before, after in ((LABEL_JOB_ID, old.job_id, new.job_id),
                                 (LABEL_SUBMISSION, old.submission, new.submission)):
        if before and after != before:
            verb = "remove it" if not after else f"change it to {after!r}"
            return f"{what}: dispatch's identity label {label}={before} is kept; this write would {verb}"
    if new.problems:
        return f"{what}: {'; '.join(new.problems)}"
    for key, was, now in ((ANNOTATION_ADMISSION, old.admission, new.admission),
                          (ANNOTATION_STARTED, old.started, new.started)):
        if now < was:
            verb = "remove it" if not now else f"lower it to {now}"
            return f"{what}: annotation {key} only rises ({was}); this write would {verb}"
    if old.patch_targets and not new.patch_targets:
        return f"{what}: dispatch's runtime patch entry ({PATCH_MANAGER}) is kept; this write would remove it"
    if new.patch_admission < old.patch_admission:
        return (f"{what}: the A in dispatch's runtime patch entry only rises ({old.patch_admission}); "
                f"this write would lower it to {new.patch_admission}")
    if new.token != old.token and new.admission <= old.admission:
        return (f"{what}: annotation {ANNOTATION_TOKEN} changes only with a raise of "
                f"{ANNOTATION_ADMISSION} (A stays {new.admission})")
    if changed := copy_marks_changed(old, new):
        return f"{what}: {changed}"
    return directive_problem(new, old) or foreign_problem(new, old)


COPY_MARKS = (MULTIKUEUE_ORIGIN_LABEL, PREBUILT_WORKLOAD_LABEL)
"""The labels (and the annotation of the prebuilt key) that make a TrainJob a MultiKueue copy in a worker: set
by MultiKueue when it creates the copy, and never changed on a dispatch TrainJob afterwards (the guard and the
``dispatch-identity`` policy), so no writer turns an object into a copy, or a copy into another's."""
COPY_PERMISSION = ("create", "dispatch.phpboyscout.uk", "multikueuecopies")
"""(verb, group, resource) the ``dispatch-identity`` policy asks the authorizer about before a dispatch TrainJob
carrying MultiKueue's origin label is created: held by the identity MultiKueue writes a worker with (bound by
``deploy/worker/``) and cluster admins only (a permission no real resource has, as ``use`` or ``bind``)."""
COPY_CREATE_DENIED = (f"a dispatch TrainJob carrying {MULTIKUEUE_ORIGIN_LABEL} is a MultiKueue copy: only the "
                      "identity MultiKueue writes this worker with creates one (create multikueuecopies of "
                      "dispatch.phpboyscout.uk, bound by deploy/worker)")
"""The ``dispatch-identity`` policy's message on a copy created by anyone else."""


def _copy_marks(tj: TrainJobView) -> tuple[str, str, str]:
    return (tj.labels.get(MULTIKUEUE_ORIGIN_LABEL, ""), tj.labels.get(PREBUILT_WORKLOAD_LABEL, ""),
            tj.prebuilt_workload)


def copy_marks_changed(old: TrainJobView, new: TrainJobView) -> str | None:
    """Why an update changes what makes a dispatch TrainJob a MultiKueue copy (``COPY_MARKS``), or None: added,
    changed or removed, a copy mark would let the guard judge an ordinary object as a copy (whose A the
    manager issued, with no record here) or a copy by another Workload's admission."""
    if not old.job_id or _copy_marks(old) == _copy_marks(new):
        return None
    return (f"the MultiKueue marks {MULTIKUEUE_ORIGIN_LABEL} and {PREBUILT_WORKLOAD_LABEL} of a dispatch TrainJob "
            "are kept as it was created (MultiKueue sets them on the copies it creates)")


def copy_create_problem(new: TrainJobView, *, allowed: bool) -> str | None:
    """Why a create of a dispatch TrainJob is refused for carrying MultiKueue's origin label (the
    ``dispatch-identity`` policy), or None. ``allowed``: the authorizer grants the requester ``COPY_PERMISSION``
    in the TrainJob's namespace."""
    if not new.job_id or MULTIKUEUE_ORIGIN_LABEL not in new.labels or allowed:
        return None
    return f"trainjob {new.name}: {COPY_CREATE_DENIED}"


def identity_policy(operation: str, old: TrainJobView | None, new: TrainJobView) -> str | None:
    """The ``dispatch-identity`` CEL policy's answer on one TrainJob write (``deploy/base/guard.yaml``), or
    None to allow: the part of ``guard`` the API server enforces itself, so it holds with the webhook off
    (``guard.enabled=false``) or removed in an emergency. The identity labels stay, A and the ``started``
    mark only rise (a value that is not a number fails the rule), and no changed entry of another manager
    sets what is dispatch's (``foreign_problem``). Fakes that run without the webhook run this."""
    if operation == "CREATE":
        return (directive_problem(new, deep=False) or foreign_problem(new)) if new.job_id else None
    if operation != "UPDATE" or old is None or not old.job_id:
        return None  # the policy's match condition: a create, or an update of an object with the job-id label
    what = f"trainjob {new.name}"
    if new.job_id != old.job_id or (old.submission and new.submission != old.submission):
        return f"{what}: dispatch's identity labels ({LABEL_JOB_ID}, /submission) are kept"
    for key, was, now in ((ANNOTATION_ADMISSION, old.admission, new.admission),
                          (ANNOTATION_STARTED, old.started, new.started)):
        unparsed = next((p for p in new.problems if p.startswith(f"annotation {key} ")), None)
        if unparsed is not None:
            return f"{what}: {unparsed}"
        if now < was:
            return f"{what}: annotation {key} only rises; it is never lowered or removed"
    if changed := copy_marks_changed(old, new):
        return f"{what}: {changed}"
    return directive_problem(new, old, deep=False) or foreign_problem(new, old)


DIRECTIVE_REFUSED = ("Trainer merges every runtime patch entry into the pods as a strategic merge patch, so a "
                     "directive could remove dispatch's identity labels from them (and hide them from the rule): "
                     "no runtime patch entry of a dispatch TrainJob carries a key starting with $")


def directive_problem(new: TrainJobView, old: TrainJobView | None = None, *, deep: bool = True) -> str | None:
    """Why a write may not leave a strategic-merge directive in a runtime patch entry of a dispatch TrainJob
    (any manager's, dispatch's own included; an entry the write left as it was is not judged), or None.
    ``deep``: at any depth of the entry (the webhook, enrolment and ``open -f``); else only where the CRD keeps
    it and Trainer's merge reads it (``_trainer.entry_directives``), as the CEL policy judges."""
    found = directive_phrases(new.patches, old.patches if old is not None else (), deep=deep)
    if not found:
        return None
    return (f"trainjob {new.name}: {'; '.join(found[:3])}{' (and more)' if len(found) > 3 else ''}; "
            f"{DIRECTIVE_REFUSED}")


def foreign_problem(new: TrainJobView, old: TrainJobView | None = None) -> str | None:
    """Why another manager's runtime patch entry may not be written so (``_trainer.foreign_settings``):
    it would decide the identity, variables or finalizer of the pods Trainer builds. None if it may."""
    found = foreign_settings(new, old)
    if not found:
        return None
    return (f"trainjob {new.name}: {'; '.join(found[:3])}{' (and more)' if len(found) > 3 else ''}; only "
            f"dispatch's entry ({PATCH_MANAGER}) sets dispatch's labels, DISPATCH_ variables and pod finalizer")


KUEUE_MANAGERS = "kueue.x-k8s.io/"
"""Kueue's runtime patch entries: rewritten with the admission's ``podSetUpdates`` when Kueue admits, after
dispatch's check is Ready, so until then they may carry an earlier admission's labels."""


def effective_problem(new: TrainJobView, *, kueue: bool = False) -> str | None:
    """Why the pods Trainer will build from every runtime patch entry (in list order) would not carry the
    TrainJob's identity and A, or None. ``kueue``: judged before Kueue admits (dispatch's raise in Kueue
    mode), so Kueue's own entries, which Kueue rewrites at admission, are left to the guard's judgement of the
    start; every other manager's entry is judged as in plain mode."""
    want = {LABEL_JOB_ID: new.job_id, LABEL_SUBMISSION: new.submission, LABEL_ADMISSION: str(new.admission)}
    for job, labels in sorted(effective_pod_labels(new, KUEUE_MANAGERS if kueue else "").items()):
        for key in OWN_POD_LABELS:
            if labels.get(key, "") != want[key]:
                return (f"trainjob {new.name} cannot start: Trainer applies every runtime patch entry in order, so "
                        f"the pods of replicatedJob {job} would carry {key}={labels.get(key) or '(none)'}, not "
                        f"{want[key]}")
    return None


def uncovered_text(trainjob: TrainJobView, jobs: Sequence[str]) -> str | None:
    """Why the runtime's replicatedJobs are not all covered by dispatch's entry (item 3 of issue 25), or None."""
    missing = uncovered(trainjob, jobs)
    if not missing:
        return None
    one = len(missing) == 1
    return (f"replicatedJob{'' if one else 's'} {', '.join(missing)} of {trainjob.runtime_kind} "
            f"{trainjob.runtime_name} {'is' if one else 'are'} not covered by dispatch's runtime patch entry "
            f"(the runtime gained {'it' if one else 'them'} after the last raise of A), so {'its' if one else 'their'}"
            " pods would carry no identity, no A and no dispatch finalizer; the next admission (`dispatch release`, "
            "or dispatch's admission check under Kueue) re-targets the entry")


def uncovered_warning(trainjob: TrainJobView, jobs: Sequence[str] | None) -> str | None:
    """``status``'s warning for an object whose runtime gained a replicatedJob its entry does not cover."""
    if jobs is None or not trainjob.dispatch_object:
        return None
    text = uncovered_text(trainjob, jobs)
    if text is None:
        return None
    if trainjob.state is State.RUNNING:
        return (f"trainjob {trainjob.name}: {text.split('; the next admission')[0]}; this execution's pods of "
                "them run outside dispatch's rule (a force delete on a lost node would not be seen): hold and "
                "release it to re-target")
    return f"trainjob {trainjob.name}: {text}"


def _names(jobs: Sequence[str]) -> str:
    return ", ".join(jobs) or "(none)"


def way_out_text(name: str) -> str:
    """The one action that ends a JobSet Trainer can no longer update: a new TrainJob, so a new JobSet."""
    return (f"`dispatch close {name}` deletes the TrainJob and its JobSet (their pods go), then open the submission "
            "again (`dispatch open`): Trainer builds the new JobSet from the runtime as it is now")


def stalled_jobset_text(trainjob: TrainJobView, jobset: JobSetView | None,
                        runtime_jobs: Sequence[str] | None) -> str | None:
    """Why Trainer can no longer bring the JobSet to what the TrainJob asks, and the way out; or None.

    A JobSet's replicatedJobs never change (JobSet's webhook refuses it), and Trainer re-applies the whole
    JobSet, so one that differs from what Trainer builds now is frozen as it is. Seen on the real control
    plane two ways: Trainer v2.2 builds from the runtime as it is now, so after the runtime gained a job a
    hold never suspends the JobSet (it runs, its replicatedJobs differ from the runtime's); Trainer v2.3
    builds from its snapshot of the runtime, so dispatch's entry re-targeted at a job the snapshot lacks adds
    a replicatedJob with no containers, the JobSet is invalid, and it stays suspended (the entry targets a
    job the JobSet lacks). Neither a hold nor a release ends it; closing and re-opening does."""
    if jobset is not None and (jobset.suspended or jobset.finished):
        orphan = orphaned_jobset_text(jobset, trainjob.ref.uid)
        if orphan:  # not a blocker (it cannot start a pod), yet Trainer builds nothing for this TrainJob
            return orphan
    if jobset is None or jobset.deleting or jobset.finished or not jobset.replicated_jobs:
        return None
    built = list(jobset.replicated_jobs)
    if not jobset.suspended and trainjob.suspended and runtime_jobs is not None and built != list(runtime_jobs):
        return (f"jobset {jobset.name} was built with replicatedJobs {_names(built)} and {trainjob.runtime_kind} "
                f"{trainjob.runtime_name} now has {_names(runtime_jobs)}: JobSet refuses any change to a JobSet's "
                "replicatedJobs, so Trainer cannot suspend it and the hold never reaches its pods (a release "
                f"cannot change it either); {way_out_text(trainjob.name)}")
    lacking = [j for j in trainjob.patch_targets if j not in built]
    if jobset.suspended and lacking:
        blocked = ("a release re-targets the entry at the runtime as it is now, so no release can start it"
                   if trainjob.suspended else f"execution {trainjob.admission} never starts")
        return (f"jobset {jobset.name} stays suspended: dispatch's runtime patch entry targets replicatedJob"
                f"{'' if len(lacking) == 1 else 's'} {_names(lacking)}, which the JobSet (replicatedJobs "
                f"{_names(built)}, built before {trainjob.runtime_kind} {trainjob.runtime_name} changed) does not "
                f"have, so Trainer's update of the JobSet is refused and {blocked}; {way_out_text(trainjob.name)}")
    return None


def runtime_missing_warning(trainjob: TrainJobView, missing: bool) -> str | None:
    """``status``'s warning for an object whose runtime was deleted after open. Trainer's webhook then refuses
    every update of the TrainJob (``runtime '<name>' not found``, or ``... "<name>" not found: specified
    trainingRuntime must be created before the TrainJob is created``), so hold and release fail while a running
    JobSet goes on; Trainer's validation does not judge a delete, so ``close`` works."""
    if not missing or not trainjob.dispatch_object:
        return None
    running = "its JobSet goes on running, and " if trainjob.state is State.RUNNING else ""
    return (f"trainjob {trainjob.name}: {trainjob.runtime_kind} {trainjob.runtime_name} is not found: Trainer's "
            f"webhook refuses every change to the TrainJob while it is gone, so "
            f"{running}`dispatch hold` and `dispatch release` fail; re-create {trainjob.runtime_kind} "
            f"{trainjob.runtime_name}, or `dispatch close {trainjob.name}` (a delete is not refused)")


def _entry_problem(what: str, new: TrainJobView, runtime_jobs: Sequence[str] | None) -> str | None:
    """Why dispatch's runtime patch entry cannot give the pods an A: it is missing, or does not cover the
    runtime's replicatedJobs as they are now; or None."""
    if not new.dispatch_object:
        return f"{what}: it has no dispatch runtime patch entry ({PATCH_MANAGER}), so its pods would carry no A"
    gap = uncovered_text(new, runtime_jobs) if runtime_jobs is not None else None
    return f"{what}: {gap}" if gap else None


def _carry_problem(what: str, new: TrainJobView) -> str | None:
    """Why the pods would not carry the TrainJob's own A (the entry names another, or another entry decides
    their identity labels), or None."""
    if new.patch_admission != new.admission:
        return f"{what}: its pods would carry A={new.patch_admission} but the TrainJob carries A={new.admission}"
    return effective_problem(new) or None


def _not_armed(operation: str, old: TrainJobView | None, new: TrainJobView, record: RecordView | None,
               workload: WorkloadView | None, runtime_jobs: Sequence[str] | None = None) -> str | None:
    """Why the A a starting write carries is not a fresh, armed one, or None."""
    what = f"trainjob {new.name} cannot start"
    if operation == "CREATE" or old is None:
        return (f"{what}: a dispatch TrainJob is created suspended and started by `dispatch release` "
                "(or Kueue through dispatch's admission check)")
    if problem := _entry_problem(what, new, runtime_jobs):
        return problem
    a = new.admission
    if (workload is not None and workload.admitted and not workload.checks
            and _raised_on(old.token, workload.ref.uid) is None):
        return (f"{what}: Kueue admitted workload {workload.ref.name} without asking any admission check, so "
                "dispatch raised no A for it (Kueue v0.19 and later skip the checks of a Workload that is given "
                "no flavor: add `pods` to the coveredResources of its ClusterQueue)")
    if record is None:
        return f"{what}: {describe_missing(new.job_id, new.submission)} is missing, so no A was issued to it"
    if not record.trainjob and not record.trainjob_uid:
        return (f"{what}: {record.describe()} names no TrainJob: its submission was released (a `dispatch "
                "close` was begun), so nothing of it starts; `dispatch close` again finishes the close")
    if record.trainjob_uid != new.ref.uid or record.admission != a:
        return (f"{what}: A={a} was not issued to it ({record.describe()} issued A={record.admission}); "
                "`dispatch release` issues a new A")
    problem = record_problem(new, record, ())
    if problem:
        return f"{what}: {problem}"
    if problem := _carry_problem(what, new):
        return problem
    if a <= old.started:
        return (f"{what}: A={a} has already started (annotation {ANNOTATION_STARTED}={old.started}); "
                "`dispatch release` issues a new A")
    if workload is not None:
        if not workload.admitted or workload.evicted or workload.finished or workload.deleting:
            return f"{what}: Kueue manages it and has not admitted workload {workload.ref.name}"
        raised_on = _raised_on(old.token, workload.ref.uid)
        writes = (old.ref.generation or 0) - raised_on if raised_on is not None else -1
        if new.token != old.token or not 1 <= writes <= KUEUE_WRITES_SINCE_RAISE:
            why = (f"{writes} spec writes since the raise; a start and a stop since would make it run twice"
                   if writes >= 0 else "its admission token names no raise for this workload")
            return f"{what}: A={a} was not raised for this admission of workload {workload.ref.name} ({why})"
        return None
    if new.started != a:
        return (f"{what}: an unsuspend must mark {ANNOTATION_STARTED}={a} in the same write "
                "(`dispatch release` does)")
    return None


def multikueue_copy(tj: TrainJobView, *, worker: bool) -> bool:
    """A worker's copy of a manager's TrainJob: dispatch here runs as a MultiKueue worker (``worker``, the
    controller's ``--multikueue-worker``) and the TrainJob carries MultiKueue's origin label, which only the
    identity MultiKueue writes with may create (``copy_create_problem``) and nobody changes afterwards
    (``copy_marks_changed``). Anywhere else the label means nothing: the object is judged as any other."""
    return worker and MULTIKUEUE_ORIGIN_LABEL in tj.labels


COPY_WRITES_BEFORE_START = KUEUE_WRITES_SINCE_RAISE
"""Spec generation a copy may have before its one start: MultiKueue creates it (1), and the worker's Kueue writes
the pod set information into its runtime patch entry, still suspended (2). A start and a stop add two more."""


def _copy_not_armed(operation: str, old: TrainJobView | None, new: TrainJobView, workload: WorkloadView | None,
                    runtime_jobs: Sequence[str] | None) -> str | None:
    """Why a MultiKueue copy may not start in this worker, or None. The manager's dispatch issued A and read
    every worker before MultiKueue made the copy; here the guard keeps the worker's own half: the copy starts
    only through the worker's Kueue (the Workload MultiKueue made for it, admitted), with the A its pods will
    carry, above the ``started`` mark, and once: MultiKueue makes a new copy for each dispatch, so a copy that
    ran (its generation past what its creation and Kueue's pod set write make) is not started again, whoever
    suspended it (a writer's suspend would otherwise let the worker's Kueue restart the same A)."""
    what = f"trainjob {new.name} cannot start"
    if operation == "CREATE" or old is None:
        return (f"{what}: a MultiKueue copy is created suspended and started by its worker's Kueue once it "
                "admits the copy's Workload")
    if problem := _entry_problem(what, new, runtime_jobs):
        return problem
    if new.admission < 1:
        return (f"{what}: this MultiKueue copy carries no A: the manager's dispatch raises A on the TrainJob "
                "before MultiKueue copies it")
    if new.admission <= old.started:
        return (f"{what}: A={new.admission} has already started (annotation {ANNOTATION_STARTED}={old.started}); "
                "the manager's dispatch issues a new A and MultiKueue makes a new copy")
    if problem := _carry_problem(what, new):
        return problem
    generation = old.ref.generation or 0
    if generation > COPY_WRITES_BEFORE_START:
        return (f"{what}: this MultiKueue copy has started before (generation {generation}: a start and a stop "
                f"since its creation); a copy runs its A once, and the manager's next dispatch makes a new copy")
    if workload is None or not workload.admitted or workload.evicted or workload.finished or workload.deleting:
        name = f" {workload.ref.name}" if workload is not None else ""
        return f"{what}: this worker's Kueue has not admitted the copy's workload{name}"
    origin = new.labels.get(MULTIKUEUE_ORIGIN_LABEL, "")
    if labels_of(dict(workload.raw)).get(MULTIKUEUE_ORIGIN_LABEL) != origin:
        return (f"{what}: the copy's workload {workload.ref.name} was not made by MultiKueue (it does not carry "
                f"{MULTIKUEUE_ORIGIN_LABEL}={origin})")
    return None


def guard(operation: str, old: TrainJobView | None, new: TrainJobView, verdict: Verdict | None,
          record: RecordView | None, workload: WorkloadView | None = None,
          runtime_jobs: Sequence[str] | None = None, *, worker: bool = False) -> str | None:
    """The admission webhook's decision on one TrainJob write: the denial message, or None to allow.

    Only dispatch TrainJobs (identity labels, on the old or the new object) are judged. Any update
    must keep their identity (``identity_change``). A write that starts an execution is denied while
    one consistent read (``verdict``) shows a pod of the object that may still run or a layer that has
    not confirmed its suspension, and unless the A it starts is fresh and armed:

    * it is the A the identity record issued to this TrainJob's uid, and the pods will carry it: every
      replicatedJob of the runtime as it is now (``runtime_jobs``) is covered by dispatch's entry, and no
      other entry decides their identity labels (``effective_problem``);
    * it is above the ``started`` mark (the highest A dispatch's own unsuspend started);
    * plain mode (no Workload): the same write marks ``started`` = A, as dispatch's unsuspend does;
    * Kueue mode (a Workload owns the TrainJob): Kueue admitted that Workload, and the TrainJob's token
      names this Workload and the generation G the raise was made on, with the object now at G+1 or
      G+2. Every spec write bumps the generation: the raise makes it G+1, and a start followed by a
      stop (the only way back to suspended after running A) adds two more, so at G+2 or below A has
      not run since its raise; G+2 leaves room for Kueue's own write of the pod set information,
      which it makes (still suspended) before it unsuspends. The token cannot be changed without
      raising A (``identity_change``), and a raised A must equal the record's, which only rises.
      Kueue's unsuspend after dispatch raised A and set its check Ready passes; a bare ``kubectl
      patch`` of a held, evicted or already-run object does not.

    Only where dispatch runs as a MultiKueue worker (``worker``) is a TrainJob with MultiKueue's origin label
    judged as a copy (``_copy_not_armed``); elsewhere the label changes nothing.

    A create that would start an execution is refused whatever ``verdict`` shows (a dispatch TrainJob, or a
    copy, is created suspended), so its answer names no pod: the guard reads nothing for it.
    """
    if not (new.labelled or (old is not None and old.labelled)):
        return None
    if operation == "UPDATE" and old is not None and old.labelled:
        change = identity_change(old, new)
        if change:
            return change
    if operation == "CREATE" and new.labelled:
        foreign = directive_problem(new) or foreign_problem(new)
        if foreign:
            return foreign
    if not starts_execution(operation, old, new):
        return None
    if not new.labelled:
        return None
    if operation == "CREATE" or old is None:
        # refused whatever the pods show: the guard reads nothing for it, so a review sent by someone other
        # than the API server learns nothing of a namespace's pods from its answer
        if multikueue_copy(new, worker=worker):
            return _copy_not_armed(operation, old, new, None, None)
        return _not_armed(operation, old, new, None, None)
    if verdict is None:
        return f"trainjob {new.name} cannot start: the guard could not read its pods"
    if not verdict.admissible:
        return f"trainjob {new.name} cannot start: {verdict.detail()}"
    if multikueue_copy(new, worker=worker):
        return _copy_not_armed(operation, old, new, workload, runtime_jobs)
    return _not_armed(operation, old, new, record, workload, runtime_jobs)


POD_RELEASE_PERMISSION = ("release", "dispatch.phpboyscout.uk", "podfinalizers")
"""(verb, group, resource) the pod policy asks the authorizer about before dispatch's finalizer may go: held by
the controller's role and the admin role only (a permission no real resource has, as ``use`` or ``bind``)."""


FLOOR_POLICY = "dispatch-floors"
"""The ValidatingAdmissionPolicy (``deploy/base/guard.yaml``) that ties a floor's writes to the namespace it names."""
FLOOR_WRITE_PERMISSION = ("dispatch.phpboyscout.uk", "submissionrecords")
"""(group, resource) the floor policy asks the authorizer about, in the namespace a floor names: a floor is created
only by whoever may ``create`` identity records there, and changed only by whoever may ``patch`` them. A floor is
cluster-scoped, so RBAC alone grants its writes cluster-wide (a RoleBinding cannot grant a cluster-scoped kind)."""


def floor_write_verb(operation: str) -> str:
    """The verb on ``FLOOR_WRITE_PERMISSION`` a floor write of ``operation`` (CREATE, UPDATE) needs."""
    return "create" if operation == "CREATE" else "patch"


def floor_write_problem(operation: str, namespace: str, *, allowed: bool) -> str | None:
    """Why a floor write is refused (the ``dispatch-floors`` policy's message), or None. ``allowed``: the
    authorizer lets the requester ``floor_write_verb(operation)`` identity records in ``namespace``."""
    if allowed:
        return None
    return (f"a floor of namespace {namespace} is written only by whoever may {floor_write_verb(operation)} "
            f"submissionrecords in {namespace}")


POD_LABELS_KEPT = ("the labels that say whose a dispatch pod is are kept (dispatch.phpboyscout.uk/job-id, /submission, "
                   "/admission; JobSet's jobset-name, replicatedjob-name, job-index; the Job controller's "
                   "controller-uid and job-name)")
"""The ``dispatch-pods`` policy's message when a write would change one of ``POD_KEPT_LABELS``."""
POD_FINALIZER_KEPT = (f"dispatch's pod finalizer {POD_FINALIZER} is removed only by dispatch's controller once the "
                      "pod's end is proven, or by `dispatch admin release-pod`")
"""The ``dispatch-pods`` policy's message when a caller without ``POD_RELEASE_PERMISSION`` removes the finalizer."""
POD_MARK_KEPT = (f"dispatch's record {ANNOTATION_MARK_SEEN} of when it first saw a pod's terminal mark is written only "
                 "by dispatch's controller or `dispatch admin release-pod`")
"""The ``dispatch-pods`` policy's message when a caller without ``POD_RELEASE_PERMISSION`` writes ``MarkSeen``:
a forged record would let the operator's word count before the pod's kubelet wrote anything."""


def pod_write_problem(old_labels: Mapping[str, str], new_labels: Mapping[str, str],
                      old_finalizers: Sequence[str], new_finalizers: Sequence[str], *,
                      may_release: bool, old_mark: str | None = None, new_mark: str | None = None) -> str | None:
    """Why an update of a dispatch pod is refused (the ``dispatch-pods`` CEL policy's message), or None.

    A pod that may still run must stay visible to both selections of the rule and keep its A: the labels
    of ``POD_KEPT_LABELS`` never change. dispatch's finalizer keeps a force-deleted pod in the API until
    its end is proven; only a caller holding ``POD_RELEASE_PERMISSION`` (the controller's finalizer keeper,
    ``dispatch admin release-pod``) removes it. A terminal phase in the object proves nothing by itself
    (Kueue and PodGC write Failed over a process that may run), so no state of the pod lets anyone else. The
    same callers alone write ``ANNOTATION_MARK_SEEN`` (``old_mark``/``new_mark``), which orders the kubelet's
    writes after a foreign terminal mark."""
    if any(old_labels.get(key) != new_labels.get(key) for key in POD_KEPT_LABELS):
        return POD_LABELS_KEPT
    if POD_FINALIZER in old_finalizers and POD_FINALIZER not in new_finalizers and not may_release:
        return POD_FINALIZER_KEPT
    if old_mark != new_mark and not may_release:
        return POD_MARK_KEPT
    return None


def _rank_text(pod: PodView) -> str:
    """``replicatedJob node, job 0, index 0``: the rank a pod runs, as JobSet and the Job controller label it."""
    if pod.rank is None:
        return "rank unknown"
    replicated, job, index = pod.rank
    return f"replicatedJob {replicated}, job {job}, index {index}"


def _conflicts(new: PodView, other: PodView) -> bool:
    """Whether ``other``, if it still runs, runs what ``new`` would: another execution (another A, or one
    unknown), or the same rank of this one (a rank that cannot be read counts as the same)."""
    if other.admission is None or other.admission != new.admission:
        return True
    return other.rank is None or new.rank is None or other.rank == new.rank


def pod_create_problem(new: PodView) -> str | None:
    """Why a pod carrying dispatch's job-id label may not be created whatever else runs, or None: without
    dispatch's finalizer it could leave the API (a force delete, PodGC) while its process runs, unseen by the
    rule; with a ``MarkSeen`` record already on it, the operator's word could count before its kubelet wrote
    anything. dispatch's runtime patch entry gives every pod the finalizer, so a pod without it was built
    from a template someone changed (another manager's entry, a mutating webhook)."""
    if not new.job_id or new.mirror:
        return None
    who = f"pod {new.name or 'of ' + new.job_id + '/' + new.submission}"
    if not new.ours:
        return (f"{who} carries dispatch's label {LABEL_JOB_ID} but not dispatch's finalizer {POD_FINALIZER}, "
                "which keeps a pod visible until its end is proven; dispatch's runtime patch entry adds it to "
                "every pod, so whatever built this pod's template removed it")
    if new.mark_seen is not None:
        return (f"{who} is created with dispatch's record {ANNOTATION_MARK_SEEN}, which only dispatch writes on "
                "a pod it has read marked terminal; remove it from the pod template")
    return None


def pod_start_problem(new: PodView, pods: Iterable[PodView], nodes: Mapping[str, NodeView]) -> str | None:
    """Why a pod of a dispatch object may not be created now (the guard's pod review), or None.

    A process starts only where a pod is created, and JobSet, Trainer and the Job controller create one
    whenever a Job, a JobSet or a pod they own is missing or deleting, whatever still runs: a deleted Job,
    re-created at once, started its rank again with the same A beside the old pod, still Running for its
    grace period. So a new pod of a submission (dispatch's identity labels) is refused while another pod of
    the submission (``pods``, by the same labels) may still run, its end not proven as the rule proves it
    (``PodView.end`` with its Node from ``nodes``), unless that pod runs another rank of the same execution:
    the ranks of one execution run side by side by design. A pod labelled as a dispatch object's (the
    guard sees only those) must carry dispatch's finalizer, which keeps it visible until its end is proven,
    and no ``MarkSeen`` record, which only dispatch writes on a pod it has read (``pod_create_problem``).
    A static pod's mirror (``PodView.mirror``) is always admitted: its kubelet runs the static pod from a file
    whatever the API says, so a refusal would hide its process from the rule, not stop
    it; and no kubelet runs a pod created through the API with the mirror's annotation."""
    problem = pod_create_problem(new)
    if problem is not None or new.mirror:
        return problem
    if not new.job_id or not new.submission:
        return None
    blocking = sorted((p for p in pods if p.uid != new.uid and p.job_id == new.job_id
                       and p.submission == new.submission and _conflicts(new, p)
                       and p.end(nodes.get(p.node) if p.node else None) == PROOF_UNPROVEN), key=lambda p: p.name)
    if not blocking:
        return None
    left = remaining(blocking, nodes)
    same = [p.name for p in blocking if p.admission == new.admission]
    what = ("the same rank of the same execution" if len(same) == len(blocking)
            else "another execution" if not same else "another execution or the same rank")
    if new.unindexed and len(same) == len(blocking):
        return (f"pod {new.name or 'of ' + new.job_id + '/' + new.submission} (A={new.admission}, {new.unindexed}) "
                f"cannot start while a pod of the same Job may still run ({remaining_detail(left)}): its Job is "
                "NonIndexed, so its pods carry no completion index and a second pod of the Job cannot be told from a "
                "replacement of one that may still run; dispatch does not run NonIndexed Jobs with parallelism above "
                "1: set completionMode: Indexed (JobSet's default) on the Job template of "
                f"{new.unindexed.split(',')[0]} in the runtime")
    parts = [f"pod {new.name or 'of ' + new.job_id + '/' + new.submission} (A={new.admission}, "
             f"{_rank_text(new)}) cannot start while a pod of {what} may still run: {remaining_detail(left)}"]
    parts.extend(text for text in (why_text(left), stuck_text(left)) if text)
    parts.append("its controller creates it again once that pod's end is proven")
    return "; ".join(parts)


def waiting_ranks_text(trainjob: TrainJobView, pods: Sequence[PodView], nodes: Mapping[str, NodeView]) -> str | None:
    """For a running object: the ranks whose pod is being deleted, its end not proven, with no other pod of the
    rank yet (a Job or JobSet deleted and re-created, a pod evicted): the guard refuses the rank's new pod until
    that end is proven (``pod_start_problem``), so status says why the rank does not run; or None."""
    if not trainjob.labelled:
        return None
    live = {p.rank for p in pods if not p.deleting and p.phase not in TERMINAL_PHASES}
    ending = [p for p in pods if p.deleting and p.rank not in live
              and p.end(nodes.get(p.node) if p.node else None) == PROOF_UNPROVEN]
    left = remaining(sorted(ending, key=lambda p: p.name), nodes)
    if not left:
        return None
    ranks = "a rank" if len(left) == 1 else f"{len(left)} ranks"
    wait = "waits" if len(left) == 1 else "wait"
    parts = [f"{ranks} of execution {trainjob.admission} {wait} to start again while the pod before may still run "
             f"({remaining_detail(left)}): the guard refuses a rank's new pod until that pod's end is proven"]
    parts.extend(text for text in (why_text(left), stuck_text(left)) if text)
    return "; ".join(parts)


OPERATOR_CONFIRMED = "operator-confirmed"
"""The proof ``dispatch admin release-pod --node-confirmed-down`` gives: the operator's word."""


def release_pod_proof(pod: PodView, node: NodeView | None, *, node_confirmed_down: bool,
                      process_gone: bool = False) -> tuple[str, tuple[str, str] | None]:
    """How ``admin release-pod`` proves one pod's end: (proof, None), or ("", (message, reason)) refused.

    A pod whose end is proven (its kubelet confirmed it, its Node is deleted or out-of-service) needs no
    word. Otherwise only the operator's word that the Node is shut down proves it (Kubernetes'
    non-graceful shutdown asks the same before the out-of-service taint), refused while that Node
    reports Ready=True: its kubelet is answering and will confirm the end itself. The one end a Ready
    kubelet does not confirm is a terminal phase someone else wrote (Kueue's failure recovery, PodGC)
    over a container that may restart: once its kubelet is back it never starts a container of a
    terminal pod once it has learned the phase, and ``process_gone`` is the operator's word that the process
    it left is gone. A kubelet back from a cut learns it only on its first sync: a real one (v1.37) wrote its
    own Running over the Failed and started the container once more before it did, so the word counts only
    once the kubelet wrote the pod's status after dispatch first saw the mark (``PodView.kubelet_wrote_since_mark``:
    a later resourceVersion, as the API server orders writes, never a comparison of the node's clock with the
    control plane's), or once its Node was registered after the pod was deleted
    (``PodView.kubelet_started_after_deletion``): a kubelet that started with the pod already deleting never
    starts a container of it, and has no earlier view to act on (the Node deleted under a live kubelet, then the
    kubelet restarted: it writes nothing more when the pod's end is already written)."""
    if not pod.ours:
        return "", (f"pod {pod.name} does not carry dispatch's finalizer {POD_FINALIZER}; nothing to release",
                    "NotHeld")
    proof = pod.end(node)
    if proof != PROOF_UNPROVEN:
        return proof, None
    if process_gone and pod.foreign_mark:
        if pod.phase not in TERMINAL_PHASES:
            return "", (f"pod {pod.name} is {pod.phase} again (its kubelet wrote it over the mark): only its "
                        "kubelet's report of its end or its node's shutdown ends it", "Unproven")
        if pod.running:
            return "", (f"pod {pod.name} is {pod.phase} with container {', '.join(pod.running)} reported running: "
                        "only its kubelet or its node's shutdown ends it", "Unproven")
        if node is None or not node.readable or not node.exists or node.ready != "True":
            state = node.state_text() if node else "not readable"
            return "", (f"node {pod.node or '(none)'} is {state}: its kubelet is not back, so it may still start "
                        f"a container of pod {pod.name}; once the node is confirmed shut down, pass "
                        "--node-confirmed-down", "NodeNotReady")
        if not pod.kubelet_wrote_since_mark and not pod.kubelet_started_after_deletion(node):
            seen = pod.mark_seen
            since = (f"dispatch first saw it marked {pod.phase} (resourceVersion {seen.resource_version})"
                     if seen is not None else f"it was marked {pod.phase}")
            return "", (f"node {pod.node} is Ready=True but its kubelet has not written pod {pod.name}'s status since "
                        f"{since}: a kubelet that comes back may write Running over the {pod.phase} and start a "
                        "container once more before it learns the phase (seen on a real kubelet); run this again "
                        "once its kubelet has written the pod's status (a kubelet back from a cut does on its first "
                        "sync), or, if it came back before dispatch saw the mark and so writes nothing more, shut "
                        "the node down and pass --node-confirmed-down", "KubeletNotReported")
        return OPERATOR_CONFIRMED, None
    if not node_confirmed_down:
        why = pod.unproven_why(node)
        if why:
            return "", (f"pod {pod.name}'s end is unproven: {why}", "Unproven")
        where = (f"node {pod.node} is {node.state_text() if node else 'not readable'}" if pod.node
                 else "it has no node and is not being deleted")
        return "", (f"pod {pod.name}'s end is unproven: its kubelet has not confirmed it and {where}; once "
                    f"{pod.node or 'its node'} is confirmed shut down, pass --node-confirmed-down "
                    "(or taint the node node.kubernetes.io/out-of-service)", "Unproven")
    if node is not None and node.exists and node.readable and node.ready == "True":
        return "", (f"node {pod.node} is Ready=True: its kubelet is answering and will confirm pod {pod.name}'s "
                    "end itself; it is not down", "NodeReady")
    return OPERATOR_CONFIRMED, None
