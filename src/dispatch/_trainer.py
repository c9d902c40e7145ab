"""Everything shaped by Kubeflow Trainer's API: the TrainJob view, its body, dispatch's runtime patch.

A new Trainer version should mean editing this file only: how a TrainJob is read (identity labels,
A, suspension, conditions), the body ``open`` creates, dispatch's own ``spec.runtimePatches`` entry
(manager ``dispatch.phpboyscout.uk/dispatch``) that carries the identity labels to every pod, the
server-side-apply body that raises A, and capability checks such as the grace-period one.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import _api as api
from ._api import Obj
from ._names import (
    ANNOTATION_ADMISSION,
    ANNOTATION_STARTED,
    ANNOTATION_TOKEN,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    LABEL_ADMISSION,
    LABEL_JOB_ID,
    LABEL_SUBMISSION,
    PATCH_MANAGER,
    PREBUILT_WORKLOAD_LABEL,
    TRAINER_GROUP,
)
from ._records import Identity, JobSpec, State, Toleration, Volume
from ._views import (
    POD_FINALIZER,
    Ref,
    annotations_of,
    condition_true,
    conditions,
    is_deleting,
    is_suspended,
    items,
    labels_of,
    mapping,
    meta,
    parse_count,
    text,
)


def _patch_replicated_jobs(entry: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = mapping(mapping(mapping(entry.get("trainingRuntimeSpec")).get("template")).get("spec"))
    return items(spec.get("replicatedJobs"))


def _pod_template(rj: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(mapping(mapping(rj.get("template")).get("spec")).get("template"))


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _creator(obj: Obj) -> str:
    for entry in items(meta(obj).get("managedFields")):
        if text(entry.get("operation")) in ("Update", "Apply") and text(entry.get("manager")):
            return text(entry.get("manager"))[:64]
    return ""


@dataclass(frozen=True)
class TrainJobView:
    """A TrainJob as dispatch reads it, parsed once."""

    ref: Ref
    job_id: str
    submission: str
    admission: int
    """A as the annotation records it (0: never admitted)."""
    patch_admission: int
    """A as dispatch's runtime patch entry carries it to the pods (0: none)."""
    token: str
    """The admission token written with the last raise of A (a retry of the same admission finds it)."""
    started: int
    """The highest A that dispatch's own unsuspend started (plain mode)."""
    queue: str | None
    suspended: bool
    deleting: bool
    complete: bool
    failed: bool
    patch_targets: tuple[str, ...]
    """The replicatedJobs dispatch's runtime patch entry targets (empty: no dispatch entry)."""
    created: datetime | None
    problems: tuple[str, ...] = ()
    """Fields dispatch owns that do not parse (a bad A annotation, say): the object is refused, alone."""
    created_by: str = ""
    """The field manager of the create (managedFields' first Update/Apply entry), if the server recorded it."""
    patch_entry: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    labels: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    patches: tuple[Mapping[str, Any], ...] = field(default=(), compare=False, repr=False)
    """Every ``spec.runtimePatches`` entry, in order (Trainer applies them so: a later one wins)."""
    runtime_kind: str = "ClusterTrainingRuntime"
    runtime_name: str = ""
    """``spec.runtimeRef``: the runtime Trainer builds the JobSet from (its replicatedJobs as they are now)."""
    managed_by: str = ""
    """``spec.managedBy`` ("" for Trainer's own controller); MultiKueue's value means a worker runs a copy."""
    prebuilt_workload: str = ""
    """A MultiKueue copy's Workload when Kueue names it by annotation rather than label."""
    ended_at: datetime | None = None
    """The ``lastTransitionTime`` of its Complete (else Failed) condition, as status words it: Trainer v2.3
    copies the condition of the JobSet of the TrainJob's name with that JobSet's time (issue 34). Another
    controller's clock: nothing decides by it."""

    @staticmethod
    def from_obj(obj: Obj) -> TrainJobView:
        labels = labels_of(obj)
        ann = annotations_of(obj)
        problems: list[str] = []

        def count(key: str) -> int:
            raw = ann.get(key)
            if raw is None:
                return 0
            value = parse_count(raw)
            if value is None:
                problems.append(f"annotation {key} is {raw[:40]!r}, not a number")
                return 0
            return value

        admission = count(ANNOTATION_ADMISSION)
        started = count(ANNOTATION_STARTED)
        entry = next((e for e in items(mapping(obj.get("spec")).get("runtimePatches"))
                      if e.get("manager") == PATCH_MANAGER), None)
        targets: list[str] = []
        patch_a = 0
        if entry is not None:
            for rj in _patch_replicated_jobs(entry):
                if text(rj.get("name")):
                    targets.append(text(rj.get("name")))
                raw = mapping(mapping(_pod_template(rj).get("metadata")).get("labels")).get(LABEL_ADMISSION)
                if raw is not None:
                    value = parse_count(raw)
                    if value is None:
                        problems.append(f"runtime patch label {LABEL_ADMISSION} is {str(raw)[:40]!r}, not a number")
                    else:
                        patch_a = max(patch_a, value)
        return TrainJobView(
            ref=Ref.of(obj),
            job_id=labels.get(LABEL_JOB_ID, ""),
            submission=labels.get(LABEL_SUBMISSION, ""),
            admission=admission,
            patch_admission=patch_a,
            token=ann.get(ANNOTATION_TOKEN, ""),
            started=started,
            queue=labels.get(KUEUE_QUEUE_LABEL) or None,
            suspended=is_suspended(obj),
            deleting=is_deleting(obj),
            complete=condition_true(obj, "Complete"),
            failed=condition_true(obj, "Failed"),
            patch_targets=tuple(targets),
            created=_parse_time(meta(obj).get("creationTimestamp")),
            problems=tuple(problems),
            created_by=_creator(obj),
            patch_entry=entry,
            labels=labels,
            patches=tuple(items(mapping(obj.get("spec")).get("runtimePatches"))),
            runtime_kind=text(mapping(mapping(obj.get("spec")).get("runtimeRef")).get("kind"))
            or "ClusterTrainingRuntime",
            runtime_name=text(mapping(mapping(obj.get("spec")).get("runtimeRef")).get("name")),
            managed_by=text(mapping(obj.get("spec")).get("managedBy"))[:253],
            prebuilt_workload=ann.get(PREBUILT_WORKLOAD_LABEL, "")[:253],
            ended_at=_parse_time(conditions(obj).get("Complete" if condition_true(obj, "Complete") else "Failed",
                                                     {}).get("lastTransitionTime")),
        )

    @property
    def name(self) -> str:
        return self.ref.name

    @property
    def identity(self) -> Identity:
        return Identity(self.job_id, self.submission, self.admission)

    @property
    def labelled(self) -> bool:
        """Carries dispatch's identity labels (job-id and submission)."""
        return bool(self.job_id and self.submission)

    @property
    def dispatch_object(self) -> bool:
        """Opened by dispatch: identity labels and dispatch's runtime patch entry."""
        return self.labelled and bool(self.patch_targets)

    @property
    def state(self) -> State:
        if self.deleting:
            return State.CLOSING
        if self.complete:
            return State.SUCCEEDED
        if self.failed:
            return State.FAILED
        if not self.suspended:
            return State.RUNNING
        return State.QUEUED if self.queue else State.HELD


# --------------------------------------------------------------------------- bodies


TRAINER_CONTAINER = "node"
"""The trainer container's name in Trainer's runtimes (its ``constants.Node``): Trainer puts
``spec.trainer``'s env and resources there, and dispatch mounts the user's volumes there."""


@dataclass(frozen=True)
class RuntimeShape:
    """What ``open`` needs to know of a (Cluster)TrainingRuntime: its replicatedJobs and, per job, its
    containers' names with the volume names and mount paths its pod template already has (so a volume of
    the spec that would collide is refused before anything is written, not when JobSet makes the pods)."""

    jobs: tuple[str, ...]
    containers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    volumes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Volume names of each job's pod template."""
    mounts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Mount paths of each job's trainer container."""

    @property
    def trainer_jobs(self) -> tuple[str, ...]:
        """The replicatedJobs whose pods have the trainer container (where volumes are mounted)."""
        return tuple(job for job in self.jobs if TRAINER_CONTAINER in self.containers.get(job, ()))


def runtime_shape(runtime: Obj) -> RuntimeShape:
    """A runtime's ``RuntimeShape``."""
    spec = mapping(mapping(mapping(runtime.get("spec")).get("template")).get("spec"))
    jobs: list[str] = []
    containers: dict[str, tuple[str, ...]] = {}
    volumes: dict[str, tuple[str, ...]] = {}
    mounts: dict[str, tuple[str, ...]] = {}
    for rj in items(spec.get("replicatedJobs")):
        job = text(rj.get("name"))
        if not job:
            continue
        jobs.append(job)
        pod = mapping(mapping(mapping(mapping(rj.get("template")).get("spec")).get("template")).get("spec"))
        found = items(pod.get("containers"))
        containers[job] = tuple(text(c.get("name")) for c in found if text(c.get("name")))
        volumes[job] = tuple(text(v.get("name")) for v in items(pod.get("volumes")) if text(v.get("name")))
        mounts[job] = tuple(text(m.get("mountPath")) for c in found if text(c.get("name")) == TRAINER_CONTAINER
                            for m in items(c.get("volumeMounts")) if text(m.get("mountPath")))
    return RuntimeShape(tuple(jobs), containers, volumes, mounts)


def runtime_jobs(runtime: Obj) -> list[str]:
    """The replicatedJob names of a (Cluster)TrainingRuntime."""
    spec = mapping(mapping(mapping(runtime.get("spec")).get("template")).get("spec"))
    return [text(rj.get("name")) for rj in items(spec.get("replicatedJobs")) if text(rj.get("name"))]


TRAINER_STEP_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
"""Trainer's label on a runtime's replicatedJob Job template; ``trainer`` marks the job Trainer sizes by numNodes."""


def runtime_nonindexed(runtime: Obj, num_nodes: int | None = None) -> dict[str, int]:
    """The replicatedJobs of a runtime whose Jobs are NonIndexed and run more than one pod at once: name ->
    parallelism. JobSet defaults a replicatedJob to Indexed, so only an explicit ``completionMode: NonIndexed``
    counts; Trainer sets the trainer job's parallelism to the TrainJob's numNodes (``num_nodes``, else the
    runtime's ``mlPolicy.numNodes``)."""
    spec = mapping(runtime.get("spec"))
    nodes = num_nodes or parse_count(mapping(spec.get("mlPolicy")).get("numNodes"))
    out: dict[str, int] = {}
    for rj in items(mapping(mapping(spec.get("template")).get("spec")).get("replicatedJobs")):
        name, template = text(rj.get("name")), mapping(rj.get("template"))
        job = mapping(template.get("spec"))
        if not name or text(job.get("completionMode")) != "NonIndexed":
            continue
        step = mapping(mapping(template.get("metadata")).get("labels")).get(TRAINER_STEP_LABEL)
        parallelism = parse_count(job.get("parallelism")) or 1
        if nodes and (name == "node" or step == "trainer"):
            parallelism = nodes
        if parallelism > 1:
            out[name] = parallelism
    return out


def runtime_replacement_policies(runtime: Obj) -> dict[str, str]:
    """``podReplacementPolicy`` of each replicatedJob's Job template in a runtime ("" when unset)."""
    spec = mapping(mapping(mapping(runtime.get("spec")).get("template")).get("spec"))
    return {text(rj.get("name")): text(mapping(mapping(rj.get("template")).get("spec")).get("podReplacementPolicy"))
            for rj in items(spec.get("replicatedJobs")) if text(rj.get("name"))}


def runtime_container_restarts(runtime: Obj) -> list[tuple[str, str, str]]:
    """(replicatedJob, container, what) for each container of a runtime's pod templates that sets its own
    ``restartPolicy`` or ``restartPolicyRules`` (sidecars, init containers with ``restartPolicy: Always``,
    are left out: they restart by design, and dispatch reads them so)."""
    out = []
    spec = mapping(mapping(mapping(runtime.get("spec")).get("template")).get("spec"))
    for rj in items(spec.get("replicatedJobs")):
        pod = mapping(mapping(mapping(mapping(rj.get("template")).get("spec")).get("template")).get("spec"))
        inits = [(c, True) for c in items(pod.get("initContainers"))]
        for c, init in [(c, False) for c in items(pod.get("containers"))] + inits:
            rules = items(c.get("restartPolicyRules"))
            own = text(c.get("restartPolicy"))
            if (not own and not rules) or (init and own == "Always" and not rules):
                continue
            what = ", ".join([*([f"restartPolicy {own}"] if own else []),
                              *(f"{text(r.get('action')) or '?'} on exit codes "
                                f"{text(mapping(r.get('exitCodes')).get('operator')) or '?'} "
                                f"{list(mapping(r.get('exitCodes')).get('values') or [])}" for r in rules)])
            out.append((text(rj.get("name")), text(c.get("name")), what))
    return out


def identity_labels(job_id: str, submission: str, admission: int | None = None) -> dict[str, str]:
    """The labels every pod of an execution carries (and the TrainJob, without A)."""
    out = {LABEL_JOB_ID: job_id, LABEL_SUBMISSION: submission}
    if admission is not None:
        out[LABEL_ADMISSION] = str(admission)
    return out


ENV_PREFIX = "DISPATCH_"
"""Trainer environment variables dispatch owns: the identity below, and any it adds later."""
ENV_FROM_LABELS = (
    ("DISPATCH_JOB_ID", LABEL_JOB_ID),
    ("DISPATCH_SUBMISSION", LABEL_SUBMISSION),
    ("DISPATCH_ADMISSION", LABEL_ADMISSION),
)
"""Environment variables every trainer container gets from its own pod's labels (downward API), so
the process can fence storage on A and can never disagree with the labels."""


ENV_NAMESPACE = "DISPATCH_NAMESPACE"
"""The pod's namespace (downward API): A counts per namespace, so a fenced checkpoint location includes it (a
pod without a service-account token has no other way to learn it)."""


def identity_env() -> list[Obj]:
    return [*({"name": var, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}
              for var, label in ENV_FROM_LABELS),
            {"name": ENV_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]


def volume_body(volume: Volume) -> Obj:
    """A ``Volume`` as a pod's ``volumes`` entry."""
    source: Obj
    if volume.claim is not None:
        source = {"persistentVolumeClaim": {"claimName": volume.claim}}
        if volume.read_only:
            source["persistentVolumeClaim"]["readOnly"] = True
    elif volume.config_map is not None:
        source = {"configMap": {"name": volume.config_map}}
    elif volume.secret is not None:
        source = {"secret": {"secretName": volume.secret}}
    else:
        source = {"emptyDir": {}}
    return {"name": volume.name, **source}


def mount_body(volume: Volume) -> Obj:
    """A ``Volume`` as a container's ``volumeMounts`` entry."""
    out: Obj = {"name": volume.name, "mountPath": volume.mount_path}
    if volume.read_only:
        out["readOnly"] = True
    if volume.sub_path is not None:
        out["subPath"] = volume.sub_path
    return out


def toleration_body(toleration: Toleration) -> Obj:
    """A ``Toleration`` as a pod's ``tolerations`` entry (empty fields left out, as the API prints them)."""
    out: Obj = {}
    if toleration.key:
        out["key"] = toleration.key
    out["operator"] = toleration.operator
    if toleration.value:
        out["value"] = toleration.value
    if toleration.effect:
        out["effect"] = toleration.effect
    if toleration.seconds is not None:
        out["tolerationSeconds"] = toleration.seconds
    return out


def _pod_spec(spec: JobSpec, trainer_job: bool) -> Obj:
    """The pod spec settings of ``spec`` for one replicatedJob (volumes only where the trainer runs)."""
    pod_spec: Obj = {}
    if spec.termination_grace_period_seconds is not None:
        pod_spec["terminationGracePeriodSeconds"] = spec.termination_grace_period_seconds
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.service_account is not None:
        pod_spec["serviceAccountName"] = spec.service_account
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": secret} for secret in spec.image_pull_secrets]
    if spec.tolerations:
        pod_spec["tolerations"] = [toleration_body(t) for t in spec.tolerations]
    if spec.volumes and trainer_job:
        pod_spec["volumes"] = [volume_body(v) for v in spec.volumes]
        pod_spec["containers"] = [{"name": TRAINER_CONTAINER, "volumeMounts": [mount_body(v) for v in spec.volumes]}]
    return pod_spec


def patch_entry(replicated: Sequence[str], labels: Mapping[str, str], spec: JobSpec | None = None,
                trainer_jobs: Collection[str] = ()) -> Obj:
    """dispatch's own runtime patch entry: identity labels, dispatch's pod finalizer (so a pod that may
    still run stays in the API even after a force delete, until dispatch proves its end) and the user's
    pod settings, per replicatedJob; the volumes go only to ``trainer_jobs`` (the jobs whose pods have
    the trainer container they are mounted in). ``spec`` None: no pod settings (an enrolled TrainJob's
    entry, which is otherwise exactly what ``open`` writes)."""
    def template(job: str) -> Obj:
        out: Obj = {"metadata": {"labels": dict(labels), "finalizers": [POD_FINALIZER]}}
        if spec is None:
            return out
        if spec.pod_annotations:
            out["metadata"]["annotations"] = dict(spec.pod_annotations)
        pod_spec = _pod_spec(spec, job in trainer_jobs)
        if pod_spec:
            out["spec"] = pod_spec
        return out

    return {
        "manager": PATCH_MANAGER,
        "trainingRuntimeSpec": {"template": {"metadata": {"labels": layer_labels(labels)}, "spec": {"replicatedJobs": [
            _replicated(rj, template(rj), labels) for rj in replicated
        ]}}},
    }


def layer_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The identity labels the JobSet and its Jobs carry (job-id and submission, not A, which changes at every
    raise): Trainer copies the entry's template labels onto the JobSet, and JobSet a Job template's labels onto
    each Job, so the layers of an object of the submission are found by the submission, whatever their name
    (a closed object's JobSet and Jobs, until garbage collection removes them)."""
    return {k: v for k, v in labels.items() if k in (LABEL_JOB_ID, LABEL_SUBMISSION)}


def _replicated(name: str, pod_template: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> Obj:
    ident = layer_labels(labels if labels is not None else
                         mapping(mapping(pod_template.get("metadata")).get("labels")))
    return {"name": name, "template": {"metadata": {"labels": ident},
                                       "spec": {"template": copy.deepcopy(dict(pod_template))}}}


def patch_entries(trainjob: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The ``spec.runtimePatches`` entries of a TrainJob, each with its ``manager``."""
    return items(mapping(trainjob.get("spec")).get("runtimePatches"))


def patch_pod_templates(entry: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The pod template (metadata and spec) a runtime patch entry sets, per replicatedJob."""
    return {text(rj.get("name")): _pod_template(rj) for rj in _patch_replicated_jobs(entry)}


def patch_pod_labels(entry: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The pod-template labels a runtime patch entry sets, per replicatedJob."""
    return {job: {str(key): str(value) for key, value in mapping(mapping(tmpl.get("metadata")).get("labels")).items()}
            for job, tmpl in patch_pod_templates(entry).items()}


OWN_POD_LABELS = (LABEL_JOB_ID, LABEL_SUBMISSION, LABEL_ADMISSION)
"""The pod labels dispatch's entry sets: the execution identity the rule, the history and the fence read."""

DIRECTIVE_PREFIX = "$"
"""What a strategic-merge directive's key starts with (``$patch``, ``$retainKeys``,
``$deleteFromPrimitiveList/...``, ``$setElementOrder/...``)."""
STRING_MAPS = ("labels", "annotations", "nodeSelector")
"""The fields of a runtime patch entry that are string maps in Trainer's API: the CRD's schema prunes a key it
does not know everywhere else, so only here does a directive reach Trainer's strategic merge."""


def _directives(value: object, path: str, out: list[tuple[str, str, str]]) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            if str(key).startswith(DIRECTIVE_PREFIX):
                out.append((path, str(key), str(item)[:40] if isinstance(item, str) else ""))
            else:
                _directives(item, f"{path}.{key}" if path else str(key), out)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            name = item.get("name") if isinstance(item, Mapping) else None
            _directives(item, f"{path}[{name if isinstance(name, str) and name else i}]", out)


_MERGED_MAPS = re.compile(
    r"trainingRuntimeSpec\.template\.(metadata\.(labels|annotations)|spec\.replicatedJobs\[[^\]]*\]\.template\."
    r"(metadata\.(labels|annotations)|spec\.template\.(metadata\.(labels|annotations)|spec\.nodeSelector)))")
"""Where a directive is one the CRD keeps and Trainer reads: a key of the labels or annotations of the JobSet
template, of a Job template or of a pod template, or of a pod's nodeSelector (what the CEL policy judges)."""


def entry_directives(entry: Mapping[str, Any], *, deep: bool = True) -> list[tuple[str, str, str]]:
    """The strategic-merge directives of a runtime patch entry, as (field path in the entry, key, value).

    Trainer merges each entry into the pods as a strategic merge patch, so a ``$patch: replace`` (or
    ``delete``) on a pod template's labels would remove dispatch's identity labels from the pods (checked
    against the real merge, ``tests/contract/data/strategic-merge.json``). ``deep``: at any depth (what
    dispatch's own checks refuse); else only where the CRD keeps a directive and the merge reads it
    (``_MERGED_MAPS``, what the CEL policy can name)."""
    out: list[tuple[str, str, str]] = []
    _directives({k: v for k, v in entry.items() if k != "manager"}, "", out)
    return out if deep else [d for d in out if _MERGED_MAPS.fullmatch(d[0])]


def directive_phrases(entries: Sequence[Mapping[str, Any]], before: Sequence[Mapping[str, Any]] = (), *,
                      deep: bool = True) -> list[str]:
    """Each directive of the ``entries`` not in ``before`` (an entry left as it was is not judged), as a phrase
    naming the entry, its manager, the directive and where it sits."""
    out: list[str] = []
    for i, entry in enumerate(entries):
        if entry in before:
            continue
        manager = text(entry.get("manager")) or "(none)"
        for path, key, value in entry_directives(entry, deep=deep):
            shown = f"{key}: {value}" if value else key
            out.append(f"spec.runtimePatches[{i}] (manager {manager}) carries the strategic-merge directive "
                       f"{shown} in {path or 'the entry'}")
    return out


def _entry_containers(tmpl: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = mapping(tmpl.get("spec"))
    return [*items(spec.get("containers")), *items(spec.get("initContainers"))]


def foreign_settings(new: TrainJobView, old: TrainJobView | None = None) -> list[str]:
    """What runtime patch entries of other managers set that is dispatch's, each as a phrase.

    Trainer applies every entry in list order, so a later entry decides what the pods carry: an entry of
    another manager that sets dispatch's identity labels to other values than the TrainJob's (its job-id
    and submission labels, its A annotation), any ``DISPATCH_`` variable of a container, or dispatch's pod
    finalizer, would make the pods carry an identity the record never issued (or stand in for the
    finalizer's protection); and one that sets dispatch's job-id or submission label on the JobSet or a
    Job to another value would hide a closed object's layers from the rule's look-up by the submission.
    Kueue's own entry carries dispatch's labels legitimately: the check's
    ``podSetUpdates`` copy them, with the TrainJob's values. With ``old`` (the object before the write),
    entries the write left as they were are not judged: a raise of A by dispatch is not refused because
    Kueue has not yet cleared an earlier admission's labels (a start is judged on the pods Trainer will
    build, ``effective_pod_labels``)."""
    wanted = {LABEL_JOB_ID: new.job_id, LABEL_SUBMISSION: new.submission, LABEL_ADMISSION: str(new.admission)}
    before = old.patches if old is not None else ()
    out: list[str] = []
    for i, entry in enumerate(new.patches):
        manager = text(entry.get("manager"))
        if manager == PATCH_MANAGER or entry in before:
            continue
        where = f"spec.runtimePatches[{i}] (manager {manager or '(none)'})"
        for key, value in _layer_labels_of(entry):
            if key in OWN_POD_LABELS and str(value) != wanted[key]:
                out.append(f"{where} sets label {key}={str(value)[:40]} on the JobSet or a Job, not the "
                           f"TrainJob's {wanted[key] or '(none)'}")
        for job, tmpl in patch_pod_templates(entry).items():
            md = mapping(tmpl.get("metadata"))
            for key, value in mapping(md.get("labels")).items():
                if key in OWN_POD_LABELS and str(value) != wanted[key]:
                    out.append(f"{where} sets pod label {key}={str(value)[:40]} on replicatedJob {job}, "
                               f"not the TrainJob's {wanted[key] or '(none)'}")
            finalizers = md.get("finalizers")
            if isinstance(finalizers, list) and POD_FINALIZER in [str(f) for f in finalizers]:
                out.append(f"{where} sets dispatch's pod finalizer {POD_FINALIZER} on replicatedJob {job}")
            for c in _entry_containers(tmpl):
                for env in items(c.get("env")):
                    if text(env.get("name")).startswith(ENV_PREFIX):
                        out.append(f"{where} sets variable {text(env.get('name'))} of container "
                                   f"{text(c.get('name'))} on replicatedJob {job}")
    return out


def _layer_labels_of(entry: Mapping[str, Any]) -> list[tuple[str, object]]:
    """The labels an entry sets on the JobSet (its template's metadata) and on each Job (a replicatedJob's
    template metadata): dispatch's job-id and submission there find a closed object's layers."""
    root = mapping(mapping(entry.get("trainingRuntimeSpec")).get("template"))
    out = list(mapping(mapping(root.get("metadata")).get("labels")).items())
    for rj in _patch_replicated_jobs(entry):
        out.extend(mapping(mapping(mapping(rj.get("template")).get("metadata")).get("labels")).items())
    return out


def effective_pod_labels(trainjob: TrainJobView, skip: str = "") -> dict[str, dict[str, str]]:
    """dispatch's identity labels of each replicatedJob's pods as Trainer will build them: every entry
    applied in list order as Trainer applies it (a strategic merge: a later entry's key wins, ``$patch:
    replace`` on the labels drops the earlier ones, ``$patch: delete`` all of them, a null value its key), for
    each replicatedJob dispatch's entry targets; entries of a manager starting with ``skip`` (non-empty) left
    out."""
    out: dict[str, dict[str, str]] = {job: {} for job in trainjob.patch_targets}
    for entry in trainjob.patches:
        if skip and text(entry.get("manager")).startswith(skip):
            continue
        for job, tmpl in patch_pod_templates(entry).items():
            if job not in out:
                continue
            labels = mapping(mapping(tmpl.get("metadata")).get("labels"))
            directive = labels.get(DIRECTIVE_PREFIX + "patch")
            if directive in ("replace", "delete"):
                out[job] = {}
                if directive == "delete":
                    continue
            for key, value in labels.items():
                if key in OWN_POD_LABELS:
                    if value is None:
                        out[job].pop(key, None)
                    else:
                        out[job][key] = str(value)
    return out


def labels_entry(manager: str, labels_by_job: Mapping[str, Mapping[str, str]]) -> Obj:
    """A runtime patch entry of ``manager`` that sets only pod-template labels, per replicatedJob: the
    shape in which Kueue carries an admission's ``podSetUpdates`` labels into the pods (an empty mapping
    gives the empty entry Kueue keeps while a Workload is not admitted)."""
    spec: Obj = {}
    if labels_by_job:
        spec["replicatedJobs"] = [{"name": job, "template": {"spec": {"template": {"metadata": {
            "labels": dict(labels)}}}}} for job, labels in labels_by_job.items()]
    return {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": spec}}}


def trainjob_body(spec: JobSpec, name: str, namespace: str, replicated: Sequence[str], *, admission: int = 0,
                  suspend: bool = True, trainer_jobs: Collection[str] = ()) -> Obj:
    """The TrainJob ``open`` creates: identity labels, A, dispatch's runtime patch entry, suspended.
    ``trainer_jobs``: the replicatedJobs whose pods mount ``spec.volumes`` (``RuntimeShape.trainer_jobs``)."""
    labels = dict(spec.labels)
    labels.update(identity_labels(spec.job_id, spec.submission))
    if spec.queue:
        labels[KUEUE_QUEUE_LABEL] = spec.queue
    if spec.priority_class:
        labels[KUEUE_PRIORITY_LABEL] = spec.priority_class
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
    env: list[Obj] = [{"name": key, "value": value} for key, value in spec.env.items()]
    env.extend(identity_env())
    trainer["env"] = env
    return {
        "apiVersion": api.TRAINJOBS.api_version,
        "kind": "TrainJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {ANNOTATION_ADMISSION: str(admission)},
        },
        "spec": {
            "runtimeRef": {"name": spec.runtime, "apiGroup": TRAINER_GROUP, "kind": spec.runtime_kind},
            "suspend": suspend,
            "trainer": trainer,
            "runtimePatches": [patch_entry(replicated, identity_labels(spec.job_id, spec.submission, admission),
                                           spec, trainer_jobs)],
        },
    }


def grace_kept(stored: Obj) -> bool:
    """Whether the server kept terminationGracePeriodSeconds in dispatch's runtime patch entry.

    Trainer before v2.3 has no such field in runtime patches and prunes it silently; a dry-run create
    shows what the server would keep, so ``open`` can refuse instead of dropping the user's setting.
    """
    for entry in items(mapping(stored.get("spec")).get("runtimePatches")):
        if entry.get("manager") != PATCH_MANAGER:
            continue
        for rj in _patch_replicated_jobs(entry):
            if "terminationGracePeriodSeconds" not in mapping(_pod_template(rj).get("spec")):
                return False
    return True


def retarget(entry: Obj, jobs: Sequence[str] | None) -> None:
    """Point dispatch's entry at exactly the runtime's replicatedJobs ``jobs`` (None: leave it as it is).

    Trainer builds the JobSet from the runtime as it is now, so a replicatedJob the runtime gained after
    ``open`` would run pods without dispatch's labels, A and finalizer; one it lost would be added back by
    Trainer's strategic merge as a bare replicatedJob. A new target gets the pod template the entry gives
    every other (``open`` writes the same one for each)."""
    if jobs is None:
        return
    tmpl_spec = entry.setdefault("trainingRuntimeSpec", {}).setdefault("template", {}).setdefault("spec", {})
    have = {text(rj.get("name")): rj for rj in tmpl_spec.get("replicatedJobs") or []}
    model = next(iter(have.values()), None)
    pod_template = copy.deepcopy(dict(_pod_template(model))) if model is not None else {}
    # volumes go only where the trainer container is (``patch_entry``): a new job gets the pod-wide settings
    pod_spec = pod_template.get("spec")
    if isinstance(pod_spec, dict):
        pod_spec.pop("volumes", None)
        pod_spec.pop("containers", None)
    tmpl_spec["replicatedJobs"] = [have[job] if job in have else _replicated(job, pod_template) for job in jobs]


def uncovered(tj: TrainJobView, jobs: Sequence[str]) -> list[str]:
    """The runtime's replicatedJobs dispatch's entry does not target (their pods would carry no identity)."""
    return [job for job in jobs if job not in tj.patch_targets]


def raise_body(tj: TrainJobView, admission: int, token: str, jobs: Sequence[str] | None = None, *,
               start: bool = False) -> Obj:
    """Server-side apply body of the first admitting write: A (and its token) on the TrainJob and in
    dispatch's runtime patch entry, conditioned on the resourceVersion read. Only dispatch's own entry of
    ``spec.runtimePatches`` is sent, so Kueue's entry (same list, another key) is merged, not replaced.
    With ``jobs`` (the runtime's replicatedJobs now) the entry is re-targeted at them (``retarget``).

    ``start`` (plain mode): the same write also starts execution ``admission``, as ``unsuspend_patch`` does
    (``spec.suspend`` false, the ``started`` mark at A), which Trainer v2.2.1 and later accept ("suspended
    before or after the update"). The body always names ``spec.suspend`` and the ``started`` mark (as read,
    unless it starts): fields an apply once set and later leaves out are removed by the API server, so a
    raise that left them out after a start would unsuspend the object, or drop its mark."""
    entry = raise_entry(tj, admission, jobs)
    annotations = {ANNOTATION_ADMISSION: str(admission), ANNOTATION_TOKEN: token}
    if start or tj.started:
        annotations[ANNOTATION_STARTED] = str(admission if start else tj.started)
    return {
        "apiVersion": api.TRAINJOBS.api_version,
        "kind": "TrainJob",
        "metadata": {
            "name": tj.name,
            "namespace": tj.ref.namespace,
            "resourceVersion": tj.ref.resource_version,
            "annotations": annotations,
        },
        "spec": {"suspend": not start and tj.suspended, "runtimePatches": [entry]},
    }


def raised_view(tj: TrainJobView, admission: int, jobs: Sequence[str] | None = None) -> TrainJobView:
    """The TrainJob as ``raise_body`` will leave it, as far as the pods Trainer builds are concerned (A, and
    every runtime patch entry with dispatch's replaced in its place): judged before a raise that also starts."""
    entry = raise_entry(tj, admission, jobs)
    patches = [entry if e.get("manager") == PATCH_MANAGER else e for e in tj.patches]
    if not any(e.get("manager") == PATCH_MANAGER for e in tj.patches):
        patches.append(entry)
    targets = tuple(text(rj.get("name")) for rj in _patch_replicated_jobs(entry) if text(rj.get("name")))
    return dataclasses.replace(tj, admission=admission, patch_admission=admission, patch_targets=targets,
                               patch_entry=entry, patches=tuple(patches))


def raise_entry(tj: TrainJobView, admission: int, jobs: Sequence[str] | None = None) -> Obj:
    """dispatch's runtime patch entry carrying A (re-targeted at ``jobs``, if given)."""
    entry = copy.deepcopy(dict(tj.patch_entry or {}))
    entry.pop("time", None)  # stamped by Trainer's defaulting webhook; not ours to own
    retarget(entry, jobs)
    labels = identity_labels(tj.job_id, tj.submission, admission)
    template_root = entry.setdefault("trainingRuntimeSpec", {}).setdefault("template", {})
    template_root.setdefault("metadata", {}).setdefault("labels", {}).update(layer_labels(labels))
    tmpl_spec = template_root.setdefault("spec", {})
    for rj in tmpl_spec.get("replicatedJobs") or []:
        job_template = rj.setdefault("template", {})
        job_template.setdefault("metadata", {}).setdefault("labels", {}).update(layer_labels(labels))
        template = job_template.setdefault("spec", {}).setdefault("template", {})
        tmeta = template.setdefault("metadata", {})
        tmeta.setdefault("labels", {}).update(labels)
        if POD_FINALIZER not in (tmeta.get("finalizers") or []):
            tmeta["finalizers"] = [*(tmeta.get("finalizers") or []), POD_FINALIZER]
    return entry


def unsuspend_patch(tj: TrainJobView, admission: int) -> Obj:
    """The merge patch that starts execution ``admission``: conditioned on the resourceVersion, and
    marking the A it started in the same write (so a later release knows that A has run)."""
    return {"metadata": {"resourceVersion": tj.ref.resource_version,
                         "annotations": {ANNOTATION_STARTED: str(admission)}},
            "spec": {"suspend": False}}


def suspend_patch() -> Obj:
    return {"spec": {"suspend": True}}
