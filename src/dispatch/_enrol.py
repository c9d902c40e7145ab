"""Enrolment: a TrainJob dispatch did not create is brought under dispatch at its creation.

An operator opts a namespace in with the label ``dispatch.phpboyscout.uk/enrol=true``. The API server
then sends every TrainJob create in it to the guard's mutating webhook (``/mutate-trainjob``,
``deploy/base/guard.yaml``), which answers with the JSONPatch that ``enrol`` computes here, over the
object and its (Cluster)TrainingRuntime. Pure: the webhook glue (``controller/_guard.py``) only reads the
runtime and encodes the answer.

Why at creation: Trainer makes the JobSet from the TrainJob as it is then, so only a create carries
dispatch's runtime patch (identity labels and the pod finalizer) to the pods; the JobSet webhook refuses
pod-template finalizer changes once the JobSet exists.

The identity (both label values, always valid and never rewritten):

* ``job-id``: the label ``dispatch.phpboyscout.uk/job-id`` if the creator set it; else the TrainJob's
  name (a DNS-1035 label, so a valid label value); with ``generateName`` (no name yet at mutation time)
  the prefix without its trailing ``-``.
* ``submission``: the label ``dispatch.phpboyscout.uk/submission`` if the creator set it; else the uid
  of the create's admission request. The object's own uid is assigned only after mutating admission;
  the request's uid is a fresh UUID for every create, so no two creates (a reused name included) share
  a (job-id, submission) pair, and an identity record never meets a second object of its submission.

A label the creator set that is not a valid value, an env variable of dispatch's set to something else,
one of dispatch's annotations, a runtime patch entry of dispatch's manager on an object without both
identity labels, or a strategic-merge directive (a key starting with ``$``) in any runtime patch entry, is
refused naming the field: nothing is rewritten. A TrainJob that already carries
both identity labels and dispatch's entry (``dispatch open``) is left exactly as it is.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._api import Obj
from ._decision import nonindexed_text
from ._names import (
    ANNOTATION_ADMISSION,
    ANNOTATION_STARTED,
    ANNOTATION_TOKEN,
    DOMAIN,
    KUEUE_QUEUE_LABEL,
    LABEL_JOB_ID,
    LABEL_SUBMISSION,
    PATCH_MANAGER,
    TRAINER_GROUP,
    TRAINER_VERSION,
    label_value_problem,
)
from ._trainer import entry_directives, identity_env, identity_labels, patch_entry, runtime_jobs, runtime_nonindexed
from ._views import mapping

ENROL_LABEL = f"{DOMAIN}/enrol"
"""On a Namespace, value ``true``: every new TrainJob there is brought under dispatch at creation."""
ENROL_VALUE = "true"
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
DEFAULT_RUNTIME_KIND = "ClusterTrainingRuntime"
"""What Trainer's API defaults ``spec.runtimeRef.kind`` to."""
OWN_ANNOTATIONS = (ANNOTATION_ADMISSION, ANNOTATION_TOKEN, ANNOTATION_STARTED)


@dataclass(frozen=True)
class Enrolment:
    """The mutating webhook's answer: a JSONPatch (empty: unchanged), or a denial naming the field."""

    patch: tuple[Obj, ...] = ()
    denial: str | None = None
    warnings: tuple[str, ...] = ()
    job_id: str = ""
    submission: str = ""

    @property
    def allowed(self) -> bool:
        return self.denial is None


def _pointer(key: str) -> str:
    """One JSON Pointer token (RFC 6901): label keys hold '/'."""
    return key.replace("~", "~0").replace("/", "~1")


def _label_field(key: str) -> str:
    return f"metadata.labels[{key}]"


def entry_index(spec: Mapping[str, Any]) -> int | None:
    """The index of dispatch's own entry in ``spec.runtimePatches``, or None."""
    patches = spec.get("runtimePatches")
    if not isinstance(patches, list):
        return None
    for i, entry in enumerate(patches):
        if isinstance(entry, Mapping) and entry.get("manager") == PATCH_MANAGER:
            return i
    return None


def directive_fields(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Each strategic-merge directive (a key starting with ``$``, at any depth) of the runtime patch entries of
    a TrainJob's spec, as (field, message) naming the entry's manager and the directive: Trainer merges every
    entry into the pods as a strategic merge patch, so one could remove dispatch's identity labels from them."""
    patches = spec.get("runtimePatches")
    if not isinstance(patches, list):
        return []
    out: list[tuple[str, str]] = []
    for i, entry in enumerate(patches):
        if not isinstance(entry, Mapping):
            continue
        manager = entry.get("manager") if isinstance(entry.get("manager"), str) and entry.get("manager") else "(none)"
        for path, key, value in entry_directives(entry):
            shown = f"{key}: {value}" if value else key
            out.append((f"spec.runtimePatches[{i}].{path}.{key}" if path else f"spec.runtimePatches[{i}].{key}",
                        f"the entry of manager {manager} carries the strategic-merge directive {shown}; Trainer "
                        "merges every runtime patch entry into the pods as a strategic merge patch, so it could "
                        "remove dispatch's identity labels from them: remove it"))
    return out


def is_dispatch(obj: Mapping[str, Any]) -> bool:
    """Already dispatch's (``dispatch open``, or this webhook invoked again): both identity labels and
    dispatch's runtime patch entry. Left exactly as it is."""
    labels = mapping(mapping(obj.get("metadata")).get("labels"))
    return bool(labels.get(LABEL_JOB_ID)) and bool(labels.get(LABEL_SUBMISSION)) \
        and entry_index(mapping(obj.get("spec"))) is not None


def runtime_ref(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the runtime the TrainJob names, or None when it names none usable."""
    ref = mapping(mapping(obj.get("spec")).get("runtimeRef"))
    name, kind = ref.get("name"), ref.get("kind") or DEFAULT_RUNTIME_KIND
    if not isinstance(name, str) or not name or kind not in RUNTIME_KINDS:
        return None
    return str(kind), name


def _refuse(name: str, why: str) -> Enrolment:
    return Enrolment(denial=f"trainjob {name or '(generated name)'} cannot be enrolled in dispatch: {why}")


def _user_label(labels: Mapping[str, Any], key: str) -> tuple[str | None, str | None]:
    """(value, problem) of an identity label the creator set (value None: not set)."""
    if key not in labels:
        return None, None
    value = labels[key]
    if not isinstance(value, str):
        return None, f"{_label_field(key)} is not a string"
    if not value:
        return None, f"{_label_field(key)} is empty; set a value or leave the label out"
    problem = label_value_problem(value)
    if problem:
        return None, f"{_label_field(key)} {value[:70]!r} {problem}"
    return value, None


def _job_id(meta: Mapping[str, Any]) -> tuple[str, str | None]:
    name = meta.get("name")
    if isinstance(name, str) and name:
        source, value = "metadata.name", name
    else:
        prefix = meta.get("generateName")
        source, value = "metadata.generateName", prefix.rstrip("-") if isinstance(prefix, str) else ""
    if not value:
        return "", "it has neither metadata.name nor metadata.generateName to take the job-id from"
    problem = label_value_problem(value)
    if problem:
        return "", f"the job-id taken from {source} {value[:70]!r} {problem}; set {_label_field(LABEL_JOB_ID)}"
    return value, None


def _env_ops(spec: Mapping[str, Any]) -> tuple[list[Obj], str | None]:
    """The ops that give every trainer container dispatch's identity variables (downward API)."""
    wanted = identity_env()
    trainer = spec.get("trainer")
    if trainer is None:
        return [{"op": "add", "path": "/spec/trainer", "value": {"env": wanted}}], None
    if not isinstance(trainer, Mapping):
        return [], "spec.trainer is not an object"
    env = trainer.get("env")
    if env is None:
        return [{"op": "add", "path": "/spec/trainer/env", "value": wanted}], None
    if not isinstance(env, list):
        return [], "spec.trainer.env is not a list"
    by_name: dict[str, tuple[int, Any]] = {}
    for i, item in enumerate(env):
        if isinstance(item, Mapping) and isinstance(item.get("name"), str):
            by_name.setdefault(item["name"], (i, item))
    ops: list[Obj] = []
    for var in wanted:
        found = by_name.get(var["name"])
        if found is None:
            ops.append({"op": "add", "path": "/spec/trainer/env/-", "value": var})
        elif dict(found[1]) != var:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            source = f"label {path[len('metadata.labels'):]}" if path.startswith("metadata.labels") else path
            return [], (f"spec.trainer.env[{found[0]}] sets {var['name']}, which dispatch sets from the pod's "
                        f"{source}; remove it")
    return ops, None


def enrol(obj: Mapping[str, Any], request_uid: str, runtime: Mapping[str, Any] | None) -> Enrolment:
    """The JSONPatch that brings a TrainJob being created under dispatch, or the refusal naming the field.

    ``runtime`` is the (Cluster)TrainingRuntime that ``runtime_ref`` names (None: it does not exist);
    its replicatedJobs are the ones dispatch's runtime patch entry targets, as ``open`` does. The patch
    adds the identity labels, the annotation A=0, the identity env variables of the trainer, dispatch's
    runtime patch entry (identity labels with A=0 and the pod finalizer) and ``spec.suspend: true``:
    the object then waits for ``dispatch release`` (plain mode) or for Kueue with dispatch's check.
    """
    meta = mapping(obj.get("metadata"))
    raw_name = meta.get("name")
    name = raw_name if isinstance(raw_name, str) else ""
    spec_raw = obj.get("spec")
    if not isinstance(spec_raw, Mapping):
        return _refuse(name, "spec is not an object")
    spec = spec_raw
    if is_dispatch(obj):
        labels = mapping(meta.get("labels"))
        return Enrolment(job_id=str(labels[LABEL_JOB_ID]), submission=str(labels[LABEL_SUBMISSION]))
    index = entry_index(spec)
    if index is not None:
        return _refuse(name, f"spec.runtimePatches[{index}] has dispatch's manager {PATCH_MANAGER} but the object "
                             f"lacks {LABEL_JOB_ID} or {LABEL_SUBMISSION}; only dispatch writes that entry")
    directives = directive_fields(spec)
    if directives:
        return _refuse(name, f"{directives[0][0]}: {directives[0][1]}")
    labels_raw = meta.get("labels")
    if labels_raw is not None and not isinstance(labels_raw, Mapping):
        return _refuse(name, "metadata.labels is not an object")
    labels = mapping(labels_raw)
    annotations_raw = meta.get("annotations")
    if annotations_raw is not None and not isinstance(annotations_raw, Mapping):
        return _refuse(name, "metadata.annotations is not an object")
    for key in OWN_ANNOTATIONS:
        if key in mapping(annotations_raw):
            return _refuse(name, f"metadata.annotations[{key}] is dispatch's own (set by its admissions); remove it")

    job_id, problem = _user_label(labels, LABEL_JOB_ID)
    if problem:
        return _refuse(name, problem)
    if job_id is None:
        job_id, problem = _job_id(meta)
        if problem:
            return _refuse(name, problem)
    submission, problem = _user_label(labels, LABEL_SUBMISSION)
    if problem:
        return _refuse(name, problem)
    if submission is None:
        submission = request_uid.lower()
        if not submission or label_value_problem(submission):
            return _refuse(name, f"the admission request's uid {request_uid[:70]!r} is not a usable submission; "
                                 f"set {_label_field(LABEL_SUBMISSION)}")

    ref = runtime_ref(obj)
    if ref is None:
        return _refuse(name, f"spec.runtimeRef names no runtime (name set, kind one of {', '.join(RUNTIME_KINDS)})")
    if runtime is None:
        return _refuse(name, f"spec.runtimeRef.name: {ref[0]} {ref[1]} not found")
    replicated = runtime_jobs(dict(runtime))
    if not replicated:
        return _refuse(name, f"spec.runtimeRef.name: {ref[0]} {ref[1]} has no replicatedJobs")
    trainer_spec = mapping(mapping(obj.get("spec")).get("trainer"))
    nodes = trainer_spec.get("numNodes")
    unindexed = nonindexed_text(f"spec.runtimeRef.name: {ref[0]} {ref[1]}",
                                runtime_nonindexed(dict(runtime), nodes if isinstance(nodes, int) else None))
    if unindexed:
        return _refuse(name, unindexed)
    env_ops, problem = _env_ops(spec)
    if problem:
        return _refuse(name, problem)

    ops: list[Obj] = []
    ident = identity_labels(job_id, submission)
    if labels_raw is None:
        ops.append({"op": "add", "path": "/metadata/labels", "value": ident})
    else:
        ops.extend({"op": "add", "path": f"/metadata/labels/{_pointer(key)}", "value": value}
                   for key, value in ident.items() if key not in labels)
    if annotations_raw is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION_ADMISSION: "0"}})
    else:
        ops.append({"op": "add", "path": f"/metadata/annotations/{_pointer(ANNOTATION_ADMISSION)}", "value": "0"})
    warnings: list[str] = []
    if spec.get("suspend") is not True:
        # Trainer's CRD defaults suspend to false before any webhook sees the object, so an explicit false
        # cannot be told from none: enrolled TrainJobs are always created suspended (the opt-in's meaning).
        ops.append({"op": "add", "path": "/spec/suspend", "value": True})
    ops.extend(env_ops)
    entry = patch_entry(replicated, identity_labels(job_id, submission, 0))
    if isinstance(spec.get("runtimePatches"), list):
        ops.append({"op": "add", "path": "/spec/runtimePatches/-", "value": entry})
    else:
        ops.append({"op": "add", "path": "/spec/runtimePatches", "value": [entry]})
    if not labels.get(KUEUE_QUEUE_LABEL):
        warnings.append(f"dispatch enrolled this TrainJob as {job_id}/{submission}, suspended: "
                        f"`dispatch release {name or '<name>'}` starts it")
    return Enrolment(patch=tuple(ops), warnings=tuple(warnings), job_id=job_id, submission=submission)


def collision(name: str, job_id: str, submission: str, holder: str, live: list[str]) -> str | None:
    """Why a TrainJob being created may not take the submission (job-id, submission), or None.

    ``holder`` is the TrainJob the submission's identity record names ("" for none: never opened, or
    closed), ``live`` the TrainJobs that carry both identity labels and are not being deleted. One
    submission is one object: a second TrainJob with a live submission's labels would never be released
    (its record names the other) and would stand in the owner's way of re-opening her submission. The
    object ``dispatch open`` claimed the record for (same name) passes."""
    others = sorted({x for x in live if x != name} | ({holder} if holder and holder != name else set()))
    if not others:
        return None
    return (f"trainjob {name or '(generated name)'} cannot be enrolled in dispatch: submission {job_id}/{submission} "
            f"is held by trainjob {others[0]}; one submission is one object: set another "
            f"{_label_field(LABEL_SUBMISSION)} (or leave it out: enrolment then takes a fresh one)")


# --------------------------------------------------------------------------- open -f trainjob.yaml

SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                 "generation", "managedFields", "selfLink")
"""Metadata the API server sets: a manifest carrying them was read from a cluster, and a create would
refuse some and silently drop the others."""


def manifest_problems(obj: object, namespace: str) -> list[tuple[str, str]]:
    """Why a TrainJob manifest cannot be opened in ``namespace``, as (field, message) pairs; empty if it can.

    Only what ``dispatch open`` needs of the manifest is checked here (what it is, where it goes, a name to
    claim the submission for); what enrolment refuses is ``enrol``'s, and the rest of the object is the
    API server's and Trainer's to validate, as for ``kubectl create``."""
    if not isinstance(obj, Mapping):
        return [("manifest", f"must be a TrainJob object (a mapping), not {type(obj).__name__}")]
    out: list[tuple[str, str]] = []
    want = f"{TRAINER_GROUP}/{TRAINER_VERSION}"
    if obj.get("apiVersion") != want:
        out.append(("apiVersion", f"must be {want} (got {obj.get('apiVersion')!r})"))
    if obj.get("kind") != "TrainJob":
        out.append(("kind", f"must be TrainJob (got {obj.get('kind')!r}); dispatch open -f takes a TrainJob "
                            "manifest or a dispatch spec file"))
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        out.append(("metadata", "must be an object with at least a name"))
        return out
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        hint = (" (generateName is not taken: the submission is claimed for a name before the TrainJob exists)"
                if meta.get("generateName") else "")
        out.append(("metadata.name", f"must be set{hint}"))
    ns = meta.get("namespace")
    if ns is not None and ns != namespace:
        out.append(("metadata.namespace", f"is {ns!r}, not the namespace {namespace!r} it would be created in; "
                                          "remove it or pass -n"))
    for key in SERVER_FIELDS:
        if key in meta:
            out.append((f"metadata.{key}", "is set by the API server; remove it (was the manifest read from a "
                                           "cluster?)"))
    if "status" in obj:
        out.append(("status", "is written by Trainer, not by a create; remove it"))
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        out.append(("spec", "must be an object"))
    else:
        out.extend(directive_fields(spec))
    return out


def _pointer_tokens(path: str) -> list[str]:
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def apply_patch(obj: Mapping[str, Any], ops: Sequence[Obj]) -> Obj:
    """``obj`` with a JSONPatch of ``add`` operations applied (all that ``enrol`` answers), as the API server
    applies a mutating webhook's answer; ``obj`` itself is not changed."""
    out: Obj = copy.deepcopy(dict(obj))
    for op in ops:
        if op.get("op") != "add":
            raise ValueError(f"only add operations are applied, not {op.get('op')!r}")
        *parents, last = _pointer_tokens(str(op["path"]))
        target: Any = out
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        value = copy.deepcopy(op["value"])
        if isinstance(target, list):
            target.append(value) if last == "-" else target.insert(int(last), value)
        else:
            target[last] = value
    return out
