"""An in-process fake Kubernetes API server behind an ``httpx2.MockTransport``.

It implements the API semantics dispatch's rule depends on, and no more: one global resourceVersion,
409 on stale conditioned writes, equality and set-based label selectors, limit/continue paging at one
snapshot, resourceVersionMatch=Exact, status subresource isolation, JSON merge patch, server-side apply
that merges list-map entries by key and removes fields its manager stopped applying, graceful deletion
(deletionTimestamp, grace periods, finalizers, background garbage collection by owner), and watch.
The contract tests run the same assertions against this and a real kube-apiserver.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import copy
import json
import re
import threading
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx2

from .. import _decision as d
from .._api import ALL, Obj, Res
from .._identity import ADMISSION_LIMIT
from ._rbac import Attributes, Binding, Forbidden, Identity, Policy, shipped_policy

Key = tuple[str, str, str, str]  # (group, plural, namespace, name)

Kind = Res
"""A kind the fake serves: the same registry the client uses (``dispatch._api``)."""

KINDS: tuple[Kind, ...] = ALL

# Lists merged by key under server-side apply (by field name; enough for the kinds above).
LIST_MAP_KEYS: dict[str, tuple[str, ...]] = {
    "runtimePatches": ("manager",),
    "replicatedJobs": ("name",),
    "admissionChecks": ("name",),
    "conditions": ("type",),
    "containers": ("name",),
    "initContainers": ("name",),
    "env": ("name",),
    "ownerReferences": ("uid",),
    "podSets": ("name",),
}

Admission = Callable[[str, Obj | None, Obj], str | None]
"""(operation, old, new) -> denial message or None; registered per plural to play a webhook."""

REQUESTER: ContextVar[Identity | None] = ContextVar("dispatch_fake_requester", default=None)
"""The identity of the request being served (None: the test acting as the cluster's admin, or the
cluster's own controllers): what an admission check asks the authorizer about, as a CEL policy's
``authorizer`` does."""


def requester() -> Identity | None:
    """The identity of the HTTP request an admission check is judging (None: unrestricted)."""
    return REQUESTER.get()


class ApiFailure(Exception):
    """Internal: becomes a Status response."""

    def __init__(self, code: int, reason: str, message: str, causes: Iterable[Obj] = (),
                 details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.causes = list(causes)
        self.details = dict(details or {})

    def body(self) -> Obj:
        out: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": self.message, "code": self.code}
        if self.reason:
            out["reason"] = self.reason
        if self.causes or self.details:
            out["details"] = {**self.details, **({"causes": self.causes} if self.causes else {})}
        return out

def resource_text(kind: Kind) -> str:
    """How the real API server names a kind in its messages: ``configmaps`` for the core group,
    ``trainjobs.trainer.kubeflow.org`` for any other."""
    return f"{kind.plural}.{kind.group}" if kind.group else kind.plural


def status_details(kind: Kind, name: str) -> Obj:
    """A Status's ``details`` as the real API server writes them (no ``group`` for the core group)."""
    return {"name": name, **({"group": kind.group} if kind.group else {}), "kind": kind.plural}


def already_exists(kind: Kind, name: str, current: Obj) -> ApiFailure:
    """A create of a name taken; the real API server says so differently while the holder is being deleted
    (a Terminating namespace re-created, measured in ``tests/contract/test_namespace_contract.py``)."""
    deleting = "object is being deleted: " if current["metadata"].get("deletionTimestamp") else ""
    return ApiFailure(409, "AlreadyExists", f'{deleting}{resource_text(kind)} "{name}" already exists',
                      details=status_details(kind, name))


@dataclass
class Fault:
    """An injected failure: matching requests fail ``times`` times."""

    method: str | None
    path: re.Pattern[str] | None
    status: int | str
    times: int
    after: bool = False
    """Apply the request, then fail (a lost reply)."""

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.path is None or bool(self.path.search(path))
        )

@dataclass
class _Watcher:
    kind: Kind
    namespace: str | None
    selector: list[tuple[str, str, tuple[str, ...]]]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[tuple[str, Obj] | None]

@dataclass
class _Requirement:
    key: str
    op: str  # =, !=, in, notin, exists, !
    values: tuple[str, ...] = ()

def parse_selector(text: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """Parse a label selector: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``."""
    out: list[tuple[str, str, tuple[str, ...]]] = []
    parts: list[str] = []
    depth = 0
    cur = ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    for raw in parts:
        part = raw.strip()
        if not part:
            continue
        m = re.match(r"^([^\s!=]+)\s+(in|notin)\s+\((.*)\)$", part)
        if m:
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            out.append((m.group(1), m.group(2), values))
        elif "!=" in part:
            key, value = part.split("!=", 1)
            out.append((key.strip(), "!=", (value.strip(),)))
        elif "=" in part:
            key, value = part.replace("==", "=").split("=", 1)
            out.append((key.strip(), "=", (value.strip(),)))
        elif part.startswith("!"):
            out.append((part[1:].strip(), "!", ()))
        else:
            if not re.match(r"^[A-Za-z0-9./_-]+$", part):
                raise ApiFailure(400, "BadRequest", f"unable to parse requirement: {part!r}")
            out.append((part, "exists", ()))
    return out

EVENT_FIELDS = ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
                "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
                "reportingComponent", "source", "type")
"""The fields the real API server selects Events by besides ``metadata.name`` and ``metadata.namespace`` (its
Event field label conversion; any other is refused: tests/contract)."""


def parse_fields(plural: str, text: str) -> list[tuple[str, bool, str]]:
    """A field selector, ``a=b``, ``a==b`` or ``a!=b`` terms joined by commas, as (path, equal, value). The
    fields the real server supports for ``plural`` only; any other is refused as the real one refuses it."""
    out = []
    for term in filter(None, text.split(",")):
        found = re.fullmatch(r"([A-Za-z.]+)(!=|==|=)(.*)", term)
        if not found:
            raise ApiFailure(400, "BadRequest", f"invalid selector: '{text}'; can't understand '{term}'")
        path, op, value = found.groups()
        allowed = ("metadata.name", "metadata.namespace", *(EVENT_FIELDS if plural == "events" else ()))
        if path not in allowed:
            raise ApiFailure(400, "BadRequest", f"field label not supported: {path}")
        out.append((path, op != "!=", value))
    return out


def fields_match(obj: Obj, selector: list[tuple[str, bool, str]]) -> bool:
    def value(path: str) -> str:
        if path == "source":
            return str(((obj.get("source") or {}).get("component")) or "")
        got: Any = obj
        for part in path.split("."):
            got = got.get(part) if isinstance(got, dict) else None
        return "" if got is None else str(got)
    return all((value(path) == want) == equal for path, equal, want in selector)


def matches(labels: Mapping[str, str], selector: list[tuple[str, str, tuple[str, ...]]]) -> bool:
    for key, op, values in selector:
        have = key in labels
        value = labels.get(key)
        if op == "=" and value != values[0]:
            return False
        if op == "!=" and value == values[0]:
            return False
        if op == "in" and value not in values:
            return False
        if op == "notin" and have and value in values:
            return False
        if op == "exists" and not have:
            return False
        if op == "!" and have:
            return False
    return True

def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out

def _path_key(element: Mapping[str, Any], keys: tuple[str, ...]) -> str:
    return "k:" + json.dumps({k: element.get(k) for k in keys}, sort_keys=True)

def _owned_paths(config: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """The field paths an applied configuration sets (SSA ownership)."""
    paths: set[tuple[str, ...]] = set()
    if isinstance(config, dict):
        for key, value in config.items():
            here = (*prefix, key)
            if isinstance(value, dict) and value:
                paths |= _owned_paths(value, here)
            elif isinstance(value, list) and key in LIST_MAP_KEYS and all(isinstance(v, dict) for v in value):
                paths.add(here)
                for element in value:
                    epath = (*here, _path_key(element, LIST_MAP_KEYS[key]))
                    paths.add(epath)
                    paths |= _owned_paths(element, epath)
            else:
                paths.add(here)
    return paths

def _apply_merge(target: Any, config: Any, field_name: str = "") -> Any:
    if isinstance(config, dict):
        out = dict(target) if isinstance(target, dict) else {}
        for key, value in config.items():
            out[key] = _apply_merge(out.get(key), value, key)
        return out
    if isinstance(config, list) and field_name in LIST_MAP_KEYS and all(isinstance(v, dict) for v in config):
        keys = LIST_MAP_KEYS[field_name]
        existing = [e for e in (target or []) if isinstance(e, dict)] if isinstance(target, list) else []
        index = {_path_key(e, keys): i for i, e in enumerate(existing)}
        out_list = list(existing)
        for element in config:
            pk = _path_key(element, keys)
            if pk in index:
                out_list[index[pk]] = _apply_merge(out_list[index[pk]], element)
            else:
                index[pk] = len(out_list)
                out_list.append(copy.deepcopy(element))
        return out_list
    return copy.deepcopy(config)

def _remove_path(obj: Any, path: tuple[str, ...]) -> None:
    """Remove one owned field (or list-map element) from ``obj``."""
    parent: Any = obj
    for i, seg in enumerate(path):
        last = i == len(path) - 1
        if isinstance(parent, dict):
            if seg not in parent:
                return
            if last:
                del parent[seg]
                return
            parent = parent[seg]
        elif isinstance(parent, list) and seg.startswith("k:"):
            want = json.loads(seg[2:])
            for j, element in enumerate(parent):
                if isinstance(element, dict) and all(element.get(kk) == vv for kk, vv in want.items()):
                    if last:
                        del parent[j]
                        return
                    parent = element
                    break
            else:
                return
        else:
            return

def _same_submission(old: Obj, new: Obj) -> bool:
    return bool(old.get("jobId") == new.get("jobId") and old.get("submission") == new.get("submission"))


def _never_lower(old: Obj, new: Obj) -> bool:
    return bool(new.get("admission", 0) >= old.get("admission", 0))


def _bound_with_a_raise(old: Obj, new: Obj) -> bool:
    def uid(spec: Obj) -> str:
        holder = spec.get("trainJob")
        return str(holder.get("uid") or "") if isinstance(holder, dict) else ""
    return not uid(new) or uid(new) == uid(old) or bool(new.get("admission", 0) > old.get("admission", 0))


def _keeps_workers(old: Obj, new: Obj) -> bool:
    before, after = old.get("clusters"), new.get("clusters")
    if before is None or bool(new.get("admission", 0) > old.get("admission", 0)):
        return True
    return isinstance(after, list) and isinstance(before, list) and all(c in after for c in before)


_Rule = tuple[str, Callable[[Obj, Obj], bool]]
"""A CRD transition rule: its message and whether it holds from an old spec to a new one."""

RECORD_RULES: tuple[_Rule, ...] = (
    ("the submission a record names never changes", _same_submission),
    ("A never decreases", _never_lower),
    ("a record is bound to a TrainJob's uid only together with a raise of A", _bound_with_a_raise),
    ("a record forgets a MultiKueue worker only together with a raise of A", _keeps_workers),
)
"""The identity-record CRD's validation rules (deploy/base/crd.yaml), as the API server enforces them."""


def _same_floor_submission(old: Obj, new: Obj) -> bool:
    return all(new.get(f) == old.get(f) for f in ("namespace", "jobId", "submission"))


FLOOR_RULES: tuple[_Rule, ...] = (
    ("the submission a floor names never changes", _same_floor_submission),
    ("A never decreases", _never_lower),
)
"""The SubmissionFloor CRD's validation rules: it names one submission for good and its A never decreases."""


FLOOR_NAME = re.compile(r"[a-z0-9-]+[.]sub-[0-9a-f]{40}")
FLOOR_NAME_RULE = "a floor's name is the namespace it names, a dot and its record's name (<namespace>.sub-<hash>)"
"""The SubmissionFloor CRD's root rule: a floor's name spells out the namespace its spec names."""


def _floor_name_holds(name: str, spec: Obj) -> bool:
    return bool(FLOOR_NAME.fullmatch(name)) and name.startswith(f"{spec.get('namespace')}.")


def _validate_identity(kind: str, required: tuple[str, ...], rules: tuple[_Rule, ...], name: str,
                       old: Obj | None, new: Obj) -> None:
    """Play an identity CRD (SubmissionRecord, SubmissionFloor): its schema (the ``required`` strings, an
    admission from 0 to ``ADMISSION_LIMIT``) and, only once the new spec passes it, its rules (a floor's name;
    the transition ``rules``), for every writer."""
    what = f'{kind}.dispatch.phpboyscout.uk "{name}" is invalid'
    spec = new.get("spec")
    causes: list[Obj] = []
    if not isinstance(spec, dict):
        causes.append({"field": "spec", "reason": "FieldValueRequired", "message": "Required value"})
    else:
        for field_name in required:
            if not isinstance(spec.get(field_name), str) or not spec.get(field_name):
                causes.append({"field": f"spec.{field_name}", "reason": "FieldValueRequired",
                               "message": "Required value"})
        admission = spec.get("admission")
        if not isinstance(admission, int) or isinstance(admission, bool) or admission < 0:
            causes.append({"field": "spec.admission", "reason": "FieldValueInvalid",
                           "message": f"Invalid value: {admission!r}: must be an integer >= 0"})
        elif admission > ADMISSION_LIMIT:
            causes.append({"field": "spec.admission", "reason": "FieldValueInvalid",
                           "message": f"Invalid value: {admission}: spec.admission in body should be less than or "
                                      f"equal to {ADMISSION_LIMIT}"})
        schema_holds = not causes
        if schema_holds and kind == "SubmissionFloor" and not _floor_name_holds(name, spec):
            # a rule at the schema's root: the real server names no field and no value
            causes.append({"field": "<nil>", "reason": "FieldValueInvalid",
                           "message": f"Invalid value: {FLOOR_NAME_RULE}"})
        old_spec = (old or {}).get("spec")
        if schema_holds and isinstance(old_spec, dict):
            for message, rule in rules:
                if not rule(old_spec, spec):
                    causes.append({"field": "spec", "reason": "FieldValueInvalid",
                                   "message": f'Invalid value: "object": {message}'})
    if causes:
        detail = ", ".join(f"{c['field']}: {c['message']}" for c in causes)
        raise ApiFailure(422, "Invalid", f"{what}: {detail}", causes)


def _validate_record(name: str, old: Obj | None, new: Obj) -> None:
    _validate_identity("SubmissionRecord", ("jobId", "submission"), RECORD_RULES, name, old, new)


def _validate_floor(name: str, old: Obj | None, new: Obj) -> None:
    _validate_identity("SubmissionFloor", ("namespace", "jobId", "submission"), FLOOR_RULES, name, old, new)


def floor_policy(operation: str, old: Obj | None, new: Obj) -> str | None:
    """The ``dispatch-floors`` ValidatingAdmissionPolicy (``deploy/base/guard.yaml``) on one floor write, worded as
    the API server words a policy's denial (None: allowed): the requester must be allowed to create (on CREATE)
    or patch (on UPDATE) identity records in the namespace the floor names. Like the CRD's rules it is always in
    force (the policy ships in every configuration); the test acting as admin and the cluster's own controllers
    are unrestricted, as on the real cluster."""
    who = requester()
    namespace = str((new.get("spec") or {}).get("namespace") or "")
    group, resource = d.FLOOR_WRITE_PERMISSION
    allowed = who is None or who.allows(
        Attributes(d.floor_write_verb(operation), "", True, group, "v1alpha1", resource, "", namespace, ""))
    problem = d.floor_write_problem(operation, namespace, allowed=allowed)
    if problem is None:
        return None
    return f"ValidatingAdmissionPolicy '{d.FLOOR_POLICY}' with binding '{d.FLOOR_POLICY}' denied request: {problem}"


def _now_text(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")

class FakeApiServer:
    """The fake API server. Thread-safe: a test may act as the cluster while a client calls it."""

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self._lock = threading.RLock()
        self._rv = 100
        self._objects: dict[Key, Obj] = {}
        self._versions: dict[Key, list[tuple[int, Obj | None]]] = defaultdict(list)
        self._history: list[tuple[int, str, Key, Obj]] = []
        self._label_index: dict[tuple[str, str, str], set[Key]] = defaultdict(set)
        self._kind_keys: dict[tuple[str, str], set[Key]] = defaultdict(set)
        self._ordered: dict[tuple[str, str], list[str]] = defaultdict(list)
        """Per kind, every ``namespace/name`` it ever held, sorted: the order of the real API server's storage
        keys, which a list walks from a continue token's position instead of rescanning the kind."""
        self._managed: dict[Key, dict[str, set[tuple[str, ...]]]] = defaultdict(dict)
        self._watchers: list[_Watcher] = []
        self._admission: dict[str, list[Admission]] = defaultdict(list)
        self._admission["submissionfloors"].append(floor_policy)  # shipped with the CRDs' rules, always in force
        self._kinds = {(kd.group, kd.plural): kd for kd in KINDS}
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.denied: list[tuple[str, str, str]] = []
        """(user, method, path) of each request a role-bound transport was refused (403)."""
        self.bytes_sent = 0
        self.clock: Callable[[], datetime] = clock or (lambda: datetime.now(UTC))
        self.compacted_below = 0
        self.prune: dict[str, Callable[[Obj], Obj]] = {}
        """Per plural: how the schema prunes a body on write (plays a CRD's structural schema)."""
        self.gc_lag = False
        """Garbage collection waits for ``collect_garbage`` instead of following each removal at once."""
        self.gc_pending: list[str] = []
        """uids of removed owners whose dependents the lagging garbage collector has not reached yet."""
        self.grace_outlasts_finalizers = True
        """A deleted pod whose last finalizer goes while its grace period runs stays until a delete with grace 0 (its
        kubelet's, PodGC's), as on the real API server (an update that empties the finalizers deletes the object
        only at a grace period of 0; tests/contract/test_job_tracking_finalizer.py holds it on the testbed). This
        fake used to let it go at once: a pod on a deleted Node that dispatch's controller freed then went before
        PodGC's 40 s. False restores that, for a test that needs the old shortcut."""
        self.before_request: Callable[[str, str], None] | None = None
        """Called with (method, path) before each HTTP request is served: lets a test act mid-call."""
        self.namespaces_deleted: set[str] = set()
        """Namespaces deleted through ``terminate_namespace``: while Terminating or gone, nothing new is created
        in them (a namespace this fake never had a Namespace object for is served as before)."""

    # ------------------------------------------------------------------ plumbing

    def transport(self, role: str | None = None, *, roles: Iterable[str | Binding] = (), user: str | None = None,
                  rbac: str | Path | Policy | None = None) -> httpx2.MockTransport:
        """The transport to hand to ``Adapter.connect(transport=...)``.

        With ``role`` or ``roles`` its requests are authorized as a user holding those roles of the shipped
        RBAC (``deploy/base/rbac.yaml``, or ``rbac``: a path, YAML text or ``Policy``) and denied with the
        real 403; without, they are unrestricted (the test acts as the cluster's admin).
        """
        wanted = ([role] if role is not None else []) + list(roles)
        if not wanted:
            return httpx2.MockTransport(self.handle)
        policy = rbac if isinstance(rbac, Policy) else (shipped_policy() if rbac is None else Policy.load(rbac))
        identity = policy.identity(wanted, user=user)

        async def handle(request: httpx2.Request) -> httpx2.Response:
            return await self.handle(request, identity)

        return httpx2.MockTransport(handle)

    def kind(self, group: str, plural: str) -> Kind:
        try:
            return self._kinds[(group, plural)]
        except KeyError:
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource") from None

    def register_kind(self, kind: Kind) -> None:
        self._kinds[(kind.group, kind.plural)] = kind

    def remove_kind(self, group: str, plural: str) -> None:
        """Forget a kind, as if its CRD were not installed."""
        self._kinds.pop((group, plural), None)

    def add_admission(self, plural: str, check: Admission) -> None:
        """Register a validating check on ``plural`` (plays a webhook; a denial is a 403/422-style refusal)."""
        self._admission[plural].append(check)

    def inject(self, *, method: str | None = None, path: str | None = None, status: int | str = 500,
               times: int = 1, after: bool = False) -> Fault:
        """Make matching requests fail: an HTTP status, or ``"timeout"``/``"connect"``."""
        fault = Fault(method, re.compile(path) if path else None, status, times, after)
        with self._lock:
            self.faults.append(fault)
        return fault

    @property
    def resource_version(self) -> int:
        return self._rv

    def _bump(self) -> int:
        self._rv += 1
        return self._rv

    def _record(self, etype: str, key: Key, obj: Obj) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        snapshot = copy.deepcopy(obj)
        self._history.append((rv, etype, key, snapshot))
        self._versions[key].append((rv, None if etype == "DELETED" else snapshot))
        for lk, lv in (obj["metadata"].get("labels") or {}).items():
            self._label_index[(key[1], lk, lv)].add(key)
            self._label_index[(key[1], lk, "")].add(key)
        known = self._kind_keys[(key[0], key[1])]
        if key not in known:
            known.add(key)
            bisect.insort(self._ordered[(key[0], key[1])], f"{key[2]}/{key[3]}")
        kind = self._kinds.get((key[0], key[1]))
        if kind is None:
            return
        for w in list(self._watchers):
            if w.kind != kind:
                continue
            if w.namespace and w.namespace != key[2]:
                continue
            if not matches(obj["metadata"].get("labels") or {}, w.selector):
                continue
            try:
                w.loop.call_soon_threadsafe(w.queue.put_nowait, (etype, snapshot))
            except RuntimeError:
                self._watchers.remove(w)

    def events(self, group: str, plural: str) -> list[tuple[str, Obj]]:
        """Every event a watch of the kind from the start (or the last ``compact``) would have delivered, in
        order: (ADDED|MODIFIED|DELETED, the object then); a DELETED event carries the object's last state."""
        with self._lock:
            return [(etype, copy.deepcopy(obj)) for _, etype, key, obj in self._history
                    if key[0] == group and key[1] == plural]

    # ------------------------------------------------------------------ internal verbs (used by the sim)

    def get(self, group: str, plural: str, namespace: str, name: str) -> Obj | None:
        with self._lock:
            obj = self._objects.get((group, plural, namespace, name))
            return copy.deepcopy(obj) if obj else None

    def objects(self, group: str, plural: str, namespace: str | None = None) -> list[Obj]:
        with self._lock:
            return [copy.deepcopy(o) for key, o in sorted(self._objects.items())
                    if key[0] == group and key[1] == plural and (namespace is None or key[2] == namespace)]

    def create(self, group: str, plural: str, namespace: str, obj: Obj, *, admit: bool = True) -> Obj:
        kind = self.kind(group, plural)
        with self._lock:
            body = copy.deepcopy(obj)
            meta = body.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            name = meta.get("name")
            if not name:
                raise ApiFailure(422, "Invalid", f"{kind.kind} is invalid: metadata.name: Required value",
                                 [{"field": "metadata.name", "message": "Required value",
                                   "reason": "FieldValueRequired"}])
            ns = namespace if kind.namespaced else ""
            if kind.namespaced and meta.get("namespace") not in (None, "", ns):
                raise ApiFailure(400, "BadRequest", "the namespace of the object does not match the request")
            key = (group, plural, ns, name)
            self._namespace_admits(kind, ns, name)
            if key in self._objects:
                raise already_exists(kind, name, self._objects[key])
            self._validate(kind, "CREATE", None, body) if admit else None
            prune = self.prune.get(plural)
            if prune is not None:
                body = prune(body)
                meta = body.setdefault("metadata", {})
            body["apiVersion"] = f"{group}/{kind.version}" if group else kind.version
            body["kind"] = kind.kind
            if kind.namespaced:
                meta["namespace"] = ns
            if not group and plural == "namespaces":  # as the API server's namespace strategy creates one
                meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = name
                body["spec"] = {"finalizers": ["kubernetes"]}
                body["status"] = {"phase": "Active"}
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now_text(self.clock())
            meta["generation"] = 1
            meta.pop("deletionTimestamp", None)
            check_size(kind, key, body)
            meta["resourceVersion"] = str(self._bump())
            self._objects[key] = body
            self._record("ADDED", key, body)
            return copy.deepcopy(body)

    def dry_run_create(self, kind: Kind, namespace: str, obj: Obj) -> Obj:
        """Validate and default a create without storing it (``dryRun=All``)."""
        with self._lock:
            name = (obj.get("metadata") or {}).get("name", "")
            key = (kind.group, kind.plural, namespace if kind.namespaced else "", name)
            self._namespace_admits(kind, key[2], name)
            if key in self._objects:
                raise already_exists(kind, name, self._objects[key])
            body = copy.deepcopy(obj)
            self._validate(kind, "CREATE", None, body)
            check_size(kind, key, body, stored=False)
            prune = self.prune.get(kind.plural)
            return prune(body) if prune else body

    def _validate(self, kind: Kind, op: str, old: Obj | None, new: Obj) -> None:
        name = (new.get("metadata") or {}).get("name", "")
        if (kind.plural == "trainjobs" and not re.match(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", name or "")) or (
            kind.plural == "trainjobs" and len(name) > 63
        ):
            raise ApiFailure(422, "Invalid", f'TrainJob.trainer.kubeflow.org "{name}" is invalid',
                             [{"field": "metadata.name", "reason": "FieldValueInvalid",
                               "message": "must be a valid RFC-1035 label of at most 63 characters"}])
        if kind.plural == "submissionrecords":
            _validate_record(name, old, new)
        if kind.plural == "submissionfloors":
            _validate_floor(name, old, new)
        for check in self._admission.get(kind.plural, []):
            denial = check(op, old, new)
            if denial and denial.startswith("ValidatingAdmissionPolicy "):  # a CEL policy's denial, as worded
                # worded as the real server words it: the denial again as the one cause, naming no field
                resource = f"{kind.plural}.{kind.group}" if kind.group else kind.plural
                raise ApiFailure(403, "Forbidden", f'{resource} "{name}" is forbidden: {denial}',
                                 [{"field": "", "message": denial}])
            if denial:
                raise ApiFailure(403, "Forbidden", f'admission webhook denied the request: {denial}')

    def _existing(self, group: str, plural: str, namespace: str, name: str) -> tuple[Kind, Key, Obj]:
        """The kind, key and stored object a write names (the caller holds the lock); NotFound if none."""
        kind = self.kind(group, plural)
        key = (group, plural, namespace if kind.namespaced else "", name)
        current = self._objects.get(key)
        if current is None:
            raise ApiFailure(404, "NotFound", f'{resource_text(kind)} "{name}" not found',
                             details=status_details(kind, name))
        return kind, key, current

    def update(self, group: str, plural: str, namespace: str, name: str, mutate: Callable[[Obj], None], *,
               status: bool | None = None, expect_rv: str | None = None, admit: bool = True) -> Obj:
        """Apply ``mutate`` to a copy and store it (the sim's write path; honours subresource isolation).

        ``status=True`` keeps only status changes, ``False`` keeps everything but status, ``None`` all.
        """
        with self._lock:
            kind, key, current = self._existing(group, plural, namespace, name)
            if expect_rv is not None and expect_rv != current["metadata"]["resourceVersion"]:
                raise ApiFailure(
                    409, "Conflict",
                    f'Operation cannot be fulfilled on {resource_text(kind)} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                )
            new = copy.deepcopy(current)
            mutate(new)
            return self._store(kind, key, current, new, status=status, admit=admit)

    def _store(self, kind: Kind, key: Key, current: Obj, new: Obj, *, status: bool | None,
               admit: bool = True) -> Obj:
        if status is True:
            merged = copy.deepcopy(current)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            if not kind.group:
                # built-in kinds (pods, nodes) take labels and annotations through /status; CRDs do not
                for field_name in ("labels", "annotations"):
                    if field_name in new.get("metadata", {}):
                        merged["metadata"][field_name] = new["metadata"][field_name]
            new = merged
        elif status is False and kind.status:
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        meta = new.setdefault("metadata", {})
        for fixed in ("uid", "creationTimestamp", "namespace", "name"):
            if fixed in current["metadata"]:
                meta[fixed] = current["metadata"][fixed]
        if "deletionTimestamp" in current["metadata"]:
            meta["deletionTimestamp"] = current["metadata"]["deletionTimestamp"]
            if "deletionGracePeriodSeconds" in current["metadata"]:
                meta["deletionGracePeriodSeconds"] = current["metadata"]["deletionGracePeriodSeconds"]
        else:
            meta.pop("deletionTimestamp", None)
        new["apiVersion"] = current["apiVersion"]
        new["kind"] = current["kind"]
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        if new == current:
            return copy.deepcopy(current)
        # a pod's labels and finalizers change through /status too, so its policy judges both
        if admit and (status is not True or (not kind.group and kind.plural == "pods")):
            self._validate(kind, "UPDATE", current, new)
        if new.get("spec") != current.get("spec"):
            meta["generation"] = int(current["metadata"].get("generation") or 1) + 1
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not (
                self.grace_outlasts_finalizers and int(meta.get("deletionGracePeriodSeconds") or 0) > 0):
            meta["resourceVersion"] = str(self._bump())
            return self._remove(key, new)
        check_size(kind, key, new)
        meta["resourceVersion"] = str(self._bump())
        self._objects[key] = new
        self._record("MODIFIED", key, new)
        return copy.deepcopy(new)

    def _remove(self, key: Key, obj: Obj) -> Obj:
        self._objects.pop(key, None)
        self._managed.pop(key, None)
        obj["metadata"]["resourceVersion"] = str(self._bump())
        self._record("DELETED", key, obj)
        self._collect_dependents(str(obj["metadata"].get("uid")))
        return copy.deepcopy(obj)

    def _collect_dependents(self, uid: str) -> None:
        """Background garbage collection: dependents of a removed owner are deleted (gracefully); while
        ``gc_lag`` is set, only once ``collect_garbage`` is stepped (the real collector works from its own
        informers, seconds behind, and a busy or broken one far longer)."""
        if self.gc_lag:
            self.gc_pending.append(uid)
            return
        self._delete_dependents(uid)

    def collect_garbage(self, owners: int | None = None) -> int:
        """One pass of the lagging garbage collector over ``owners`` removed owners (None: all waiting);
        their dependents go (and theirs wait for the next pass). Returns how many owners were collected."""
        with self._lock:
            take = self.gc_pending[:owners] if owners is not None else list(self.gc_pending)
            del self.gc_pending[:len(take)]
            for uid in take:
                self._delete_dependents(uid)
            return len(take)

    def miss_garbage(self) -> int:
        """The collector never learns of the owners it has not reached yet (``gc_lag``): their dependents stay
        until someone deletes them. What the real one did (issue 34, k8s-1.37) when a TrainJob was deleted
        just before a kube-apiserver restart and re-created under the same name: its informer, back after the
        restart, saw the name with a new uid as an update, not a deletion, and no resync corrects that.
        Returns how many owners were dropped."""
        with self._lock:
            dropped = len(self.gc_pending)
            self.gc_pending.clear()
            return dropped

    def _delete_dependents(self, uid: str) -> None:
        for key, obj in list(self._objects.items()):
            owners = obj["metadata"].get("ownerReferences") or []
            if any(o.get("uid") == uid for o in owners) and key in self._objects:
                self.delete(key[0], key[1], key[2], key[3])

    def delete_namespace(self, namespace: str) -> int:
        """Delete a namespace as its controller does: every object in it is deleted (finalizers and pods'
        grace periods hold some for a while), the Namespace itself once nothing is left. Cluster-scoped
        objects (nodes, dispatch's floors) stay. Call again to finish; returns how many objects remain."""
        with self._lock:
            left = [k for k in self._objects if k[2] == namespace and self._kinds[(k[0], k[1])].namespaced]
            for key in left:
                if key in self._objects and not self._objects[key]["metadata"].get("deletionTimestamp"):
                    self.delete(key[0], key[1], key[2], key[3], grace=0 if key[1] == "pods" else None)
            remaining = sum(1 for k in self._objects if k[2] == namespace
                            and self._kinds[(k[0], k[1])].namespaced)
            ns_key = ("", "namespaces", "", namespace)
            if not remaining and ns_key in self._objects:
                self._remove(ns_key, copy.deepcopy(self._objects[ns_key]))
            return remaining

    # ------------------------------------------------------------------ a namespace's lifecycle, as the real one

    def terminate_namespace(self, namespace: str) -> Obj:
        """``kubectl delete namespace``: the API server marks the Namespace Terminating (a deletionTimestamp,
        phase Terminating, the ``kubernetes`` finalizer that holds it until the namespace controller is done)
        and leaves its content alone; ``namespace_controller_pass`` deletes that. From now on nothing new is
        created in it, by any writer or controller (the NamespaceLifecycle admission plugin); what is in it can
        still be read, updated and deleted. Idempotent, as a second delete is."""
        with self._lock:
            key = ("", "namespaces", "", namespace)
            current = self._objects.get(key)
            if current is None:
                raise ApiFailure(404, "NotFound", f'namespaces "{namespace}" not found',
                                 details=status_details(self.kind("", "namespaces"), namespace))
            self.namespaces_deleted.add(namespace)
            if current["metadata"].get("deletionTimestamp"):
                return copy.deepcopy(current)
            marked = copy.deepcopy(current)
            marked.setdefault("spec", {})["finalizers"] = ["kubernetes"]
            marked.setdefault("status", {})["phase"] = "Terminating"
            return self._mark_deleting(key, marked, None)

    def namespace_controller_pass(self, namespace: str) -> int:
        """One pass of the namespace controller over a Terminating namespace (``terminate_namespace``), in
        the order the real one keeps (ordered namespace deletion, seen on Kubernetes 1.37): its pods first,
        each deleted with its own grace period, and nothing else while any pod remains; then every other
        kind's content, as its delete does (an object with finalizers stays, Terminating, until their owners
        remove them); once nothing is left its ``kubernetes`` finalizer goes and so does the Namespace. Other
        controllers' creates in the namespace are refused meanwhile. Returns how many objects remain in it
        (0 once the Namespace is gone, or if it is not being deleted)."""
        with self._lock:
            ns_key = ("", "namespaces", "", namespace)
            current = self._objects.get(ns_key)
            if current is None or not current["metadata"].get("deletionTimestamp"):
                return 0

            def content(pods_only: bool = False) -> list[Key]:
                return [key for key in self._objects if key[2] == namespace
                        and (kind := self._kinds.get((key[0], key[1]))) is not None and kind.namespaced
                        and (not pods_only or (kind.group, kind.plural) == ("", "pods"))]
            for key in content(pods_only=True) or content():
                obj = self._objects.get(key)
                if obj is not None and not obj["metadata"].get("deletionTimestamp"):
                    self.delete(*key)
            remaining = len(content())
            if not remaining:
                self._remove(ns_key, copy.deepcopy(current))
            return remaining

    def _namespace_admits(self, kind: Kind, namespace: str, name: str) -> None:
        """The NamespaceLifecycle admission plugin on a create, for a namespace ``terminate_namespace``
        deleted: refused while it is Terminating (403, as worded by the real API server) and once it is gone
        until a Namespace of that name is created again (404)."""
        if not kind.namespaced or namespace not in self.namespaces_deleted:
            return
        ns = self._objects.get(("", "namespaces", "", namespace))
        if ns is None:
            raise ApiFailure(404, "NotFound", f'namespaces "{namespace}" not found',
                             details=status_details(self.kind("", "namespaces"), namespace))
        if ns["metadata"].get("deletionTimestamp"):
            raise ApiFailure(403, "Forbidden", f'{resource_text(kind)} "{name}" is forbidden: unable to create new '
                                               f"content in namespace {namespace} because it is being terminated",
                             [{"reason": "NamespaceTerminating", "field": "metadata.namespace",
                               "message": f"namespace {namespace} is being terminated"}],
                             details=status_details(kind, name))

    def delete(self, group: str, plural: str, namespace: str, name: str, *, grace: int | None = None,
               uid: str | None = None, resource_version: str | None = None, propagation: str | None = None) -> Obj:
        """Delete as the API server does: pods on a node terminate gracefully, finalizers hold others, and a
        Namespace turns Terminating until the namespace controller has emptied it (``terminate_namespace``).
        ``propagation="Orphan"`` (``kubectl delete --cascade=orphan``): the dependents stay, their owner
        references to this object removed first (the real garbage collector's ``orphan`` finalizer, done at
        once here); otherwise they are collected in the background, as before."""
        if not group and plural == "namespaces":
            return self.terminate_namespace(name)
        with self._lock:
            _, key, current = self._existing(group, plural, namespace, name)
            if uid is not None and current["metadata"].get("uid") != uid:
                raise ApiFailure(409, "Conflict", f"Precondition failed: UID in precondition: {uid}")
            if resource_version is not None and current["metadata"].get("resourceVersion") != resource_version:
                raise ApiFailure(409, "Conflict", "Precondition failed: ResourceVersion in precondition: "
                                                  f"{resource_version}")
            if propagation == "Orphan":
                self._orphan_dependents(str(current["metadata"].get("uid")))
                _, key, current = self._existing(group, plural, namespace, name)
            meta = current["metadata"]
            finalizers = meta.get("finalizers") or []
            if plural == "pods":
                phase = (current.get("status") or {}).get("phase")
                node = (current.get("spec") or {}).get("nodeName")
                if grace is None:
                    grace = int((current.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
                if not node or phase in ("Succeeded", "Failed"):
                    grace = 0
                if meta.get("deletionTimestamp"):
                    current_grace = int(meta.get("deletionGracePeriodSeconds") or 0)
                    if grace != 0 or current_grace == 0:
                        return copy.deepcopy(current)
                    if finalizers:  # a force delete of a terminating pod a finalizer holds: grace becomes 0
                        return self._mark_deleting(key, current, 0)
                if grace > 0:
                    return self._mark_deleting(key, current, grace)
            if finalizers:
                if meta.get("deletionTimestamp"):
                    return copy.deepcopy(current)
                return self._mark_deleting(key, current, 0)
            return self._remove(key, copy.deepcopy(current))

    def _orphan_dependents(self, uid: str) -> None:
        """The garbage collector's orphaning: every dependent of ``uid`` loses its owner reference to it (a
        plain metadata write, MODIFIED; labels such as a Job's ``controller-uid`` stay on its pods)."""
        for key, obj in list(self._objects.items()):
            if not any(o.get("uid") == uid for o in obj["metadata"].get("ownerReferences") or []):
                continue

            def drop(o: Obj) -> None:
                refs = [r for r in o["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
                if refs:
                    o["metadata"]["ownerReferences"] = refs
                else:
                    o["metadata"].pop("ownerReferences", None)
            self.update(key[0], key[1], key[2], key[3], drop, status=None, admit=False)

    def _mark_deleting(self, key: Key, current: Obj, grace: int | None) -> Obj:
        """A delete that leaves the object in place, Terminating: its deletionTimestamp (now plus the grace
        period) and grace period set (a Namespace gets none: the real one has no such field), a new
        resourceVersion, a MODIFIED event."""
        new = copy.deepcopy(current)
        new["metadata"]["deletionTimestamp"] = _now_text(self.clock() + timedelta(seconds=grace or 0))
        if grace is not None:
            new["metadata"]["deletionGracePeriodSeconds"] = grace
        new["metadata"]["resourceVersion"] = str(self._bump())
        self._objects[key] = new
        self._record("MODIFIED", key, new)
        return copy.deepcopy(new)

    # ------------------------------------------------------------------ lists

    def _candidates(self, kind: Kind, namespace: str | None, selector: list[tuple[str, str, tuple[str, ...]]],
                    after: str, limit: int) -> Iterable[Key]:
        """The keys a list examines, in the real storage's order (``namespace/name`` as text, as etcd orders
        its keys), each strictly after ``after`` (a continue token's last name): a superset of the objects the
        selector matches at any snapshot (the label index only grows). A selective selector reads the label
        index; one that matches much of the kind walks the sorted keys from ``after``, so that a paged list of
        100,000 pods costs each page its own items, not a rescan of the kind."""
        ordered = self._ordered.get((kind.group, kind.plural), [])
        indexed: list[set[Key]] = []
        for key_, op, values in selector:
            if op == "=":
                indexed.append(self._label_index.get((kind.plural, key_, values[0]), set()))
            elif op == "in":   # the union of each value's entries (batched reads select many objects so)
                indexed.append(set().union(*(self._label_index.get((kind.plural, key_, v), set()) for v in values)))
            elif op == "exists":
                indexed.append(self._label_index.get((kind.plural, key_, ""), set()))
        smallest = min((len(found) for found in indexed), default=None)
        if smallest is not None and (not limit or smallest * smallest <= limit * len(ordered) + len(ordered)):
            indexed.sort(key=len)
            keys = set(indexed[0]).intersection(*indexed[1:])
            chosen = sorted((f"{k[2]}/{k[3]}", k) for k in keys if k[0] == kind.group and k[1] == kind.plural
                            and (namespace is None or k[2] == namespace))
            return (k for text, k in chosen if not after or text > after)
        return self._walk(kind, ordered, namespace, after)

    @staticmethod
    def _walk(kind: Kind, ordered: list[str], namespace: str | None, after: str) -> Iterable[Key]:
        prefix = "" if namespace is None else f"{namespace}/"
        start = max(bisect.bisect_right(ordered, after) if after else 0, bisect.bisect_left(ordered, prefix))
        for i in range(start, len(ordered)):
            text = ordered[i]
            if prefix and not text.startswith(prefix):
                return
            ns, name = text.split("/", 1)
            yield (kind.group, kind.plural, ns, name)

    def _at(self, key: Key, rv: int) -> Obj | None:
        found: Obj | None = None
        for vrv, obj in self._versions.get(key, []):
            if vrv > rv:
                break
            found = obj
        return found

    def list(self, kind: Kind, namespace: str | None, params: Mapping[str, str]) -> Obj:
        with self._lock:
            selector = parse_selector(params.get("labelSelector", ""))
            fields = parse_fields(kind.plural, params.get("fieldSelector", ""))
            limit = int(params.get("limit") or 0)
            token = params.get("continue")
            rv_param = params.get("resourceVersion")
            match = params.get("resourceVersionMatch")
            if token and (rv_param not in (None, "") or match):
                raise ApiFailure(400, "BadRequest",
                                 "specifying resource version is not allowed when using continue")
            if match and match not in ("Exact", "NotOlderThan"):
                raise ApiFailure(400, "BadRequest", f"unsupported resourceVersionMatch {match!r}")
            if match and not rv_param:
                raise ApiFailure(422, "Invalid", "resourceVersionMatch is forbidden unless resourceVersion is provided")
            after = ""
            if token:
                try:
                    state = json.loads(base64.urlsafe_b64decode(token.encode()).decode())
                    snap_rv, after = int(state["rv"]), str(state["after"])
                except (ValueError, KeyError) as exc:
                    raise ApiFailure(400, "BadRequest", "invalid continue token") from exc
                if snap_rv < self.compacted_below:
                    raise ApiFailure(410, "Expired", "the provided continue parameter is too old")
            elif rv_param and match == "Exact":
                snap_rv = int(rv_param)
                if snap_rv < self.compacted_below:
                    raise ApiFailure(410, "Expired", f"too old resource version: {snap_rv}")
                if snap_rv > self._rv:
                    raise ApiFailure(504, "Timeout", f"Too large resource version: {snap_rv}")
            else:
                snap_rv = self._rv
            items: list[Obj] = []
            next_after = ""
            for key in self._candidates(kind, namespace, selector, after, limit):
                obj = self._objects.get(key) if snap_rv == self._rv else self._at(key, snap_rv)
                if obj is None or not matches(obj["metadata"].get("labels") or {}, selector):
                    continue
                if fields and not fields_match(obj, fields):
                    continue
                if limit and len(items) >= limit:
                    next_after = items[-1]["metadata"].get("namespace", "") + "/" + items[-1]["metadata"]["name"]
                    break
                items.append(copy.deepcopy(obj))
            meta: Obj = {"resourceVersion": str(snap_rv)}
            if next_after:
                meta["continue"] = base64.urlsafe_b64encode(
                    json.dumps({"rv": snap_rv, "after": next_after}).encode()).decode()
            return {"kind": f"{kind.kind}List", "apiVersion": f"{kind.group}/{kind.version}" if kind.group
                    else kind.version, "metadata": meta, "items": items}

    # ------------------------------------------------------------------ apply

    def apply(self, kind: Kind, namespace: str, name: str, config: Obj, manager: str, force: bool,
              *, subresource: str | None = None) -> Obj:
        with self._lock:
            key = (kind.group, kind.plural, namespace if kind.namespaced else "", name)
            expect = (config.get("metadata") or {}).get("resourceVersion")
            body = copy.deepcopy(config)
            body.get("metadata", {}).pop("resourceVersion", None)
            current = self._objects.get(key)
            if current is None:
                if subresource:
                    raise ApiFailure(404, "NotFound", f'{kind.plural} "{name}" not found')
                if expect:
                    raise ApiFailure(409, "Conflict", f'{kind.plural} "{name}" not found for precondition')
                created = self.create(kind.group, kind.plural, namespace, body)
                self._managed[key][manager] = _owned_paths(_strip_identity(body))
                return created
            if expect is not None and expect != current["metadata"]["resourceVersion"]:
                raise ApiFailure(
                    409, "Conflict",
                    f'Operation cannot be fulfilled on {kind.plural} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                )
            stripped = _strip_identity(body)
            if subresource == "status":
                stripped = {"status": stripped.get("status", {})}
            elif kind.status:
                stripped.pop("status", None)
            new_paths = _owned_paths(stripped)
            owners = self._managed[key]
            if not force:
                for other, paths in owners.items():
                    if other != manager and paths & new_paths:
                        raise ApiFailure(409, "Conflict", f"Apply failed with conflicts with {other}")
            old_paths = owners.get(manager, set())
            new = copy.deepcopy(current)
            others = set().union(*[p for m, p in owners.items() if m != manager]) if owners else set()
            for path in sorted(old_paths - new_paths, key=len, reverse=True):
                if path in others or any(o[: len(path)] == path for o in others):
                    continue
                _remove_path(new, path)
            new = _apply_merge(new, stripped)
            result = self._store(kind, key, current, new, status=True if subresource == "status" else
                                 (False if kind.status else None))
            for other in list(owners):
                if other != manager:
                    owners[other] = owners[other] - new_paths
            owners[manager] = new_paths
            return result

    # ------------------------------------------------------------------ HTTP

    async def handle(self, request: httpx2.Request, identity: Identity | None = None) -> httpx2.Response:
        method = request.method
        path = request.url.path
        await asyncio.sleep(0)  # a scheduling point, so concurrent clients interleave per request
        hook = self.before_request
        if hook is not None:
            hook(method, path)
        params = {k: v[-1] for k, v in parse_qs(request.url.query.decode() if isinstance(
            request.url.query, bytes) else str(request.url.query)).items()}
        with self._lock:
            self.requests.append((method, path, params))
            fault = next((f for f in self.faults if f.times > 0 and f.matches(method, path)), None)
            if fault is not None:
                fault.times -= 1
        if fault is not None and not fault.after:
            return self._fail(fault, request)
        token = REQUESTER.set(identity)
        try:
            if identity is not None:
                identity.authorize(method, path, params, request.headers.get("content-type", ""), self._exists)
            response = await self._dispatch(method, path, params, request)
        except ApiFailure as exc:
            response = self._json(exc.code, exc.body())
        except Forbidden as exc:
            with self._lock:
                self.denied.append((identity.user if identity else "", method, path))
            response = self._json(403, exc.body)
        finally:
            REQUESTER.reset(token)
        if fault is not None:
            return self._fail(fault, request)
        return response

    def _exists(self, a: Attributes) -> bool:
        kind = self._kinds.get((a.group, a.resource))
        return kind is not None and self.get(a.group, a.resource, a.namespace if kind.namespaced else "",
                                             a.name) is not None

    def _fail(self, fault: Fault, request: httpx2.Request) -> httpx2.Response:
        if fault.status == "timeout":
            raise httpx2.ReadTimeout("injected timeout", request=request)
        if fault.status == "connect":
            raise httpx2.ConnectError("injected connection failure", request=request)
        code = int(fault.status)
        reason = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
                  403: "Forbidden", 404: "NotFound"}.get(code, "Unknown")
        return self._json(code, ApiFailure(code, reason, f"injected {code}").body())

    def _json(self, code: int, body: Obj) -> httpx2.Response:
        data = json.dumps(body).encode()
        self.bytes_sent += len(data)
        return httpx2.Response(code, content=data, headers={"Content-Type": "application/json",
                                                           "Date": format_datetime(self.clock(), usegmt=True)})

    async def _dispatch(self, method: str, path: str, params: dict[str, str],
                        request: httpx2.Request) -> httpx2.Response:
        segs = [s for s in path.split("/") if s]
        if len(segs) >= 2 and segs[0] == "api":
            group, rest = "", segs[2:]
        elif len(segs) >= 3 and segs[0] == "apis":
            group, rest = segs[1], segs[3:]
        else:
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest:
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        kind = self.kind(group, rest[0])
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        ns = namespace or ""
        body: Obj = {}
        if len(request.content) > REQUEST_BODY_LIMIT:
            raise ApiFailure(413, "RequestEntityTooLarge", f"Request entity too large: limit is {REQUEST_BODY_LIMIT}")
        if request.content:
            try:
                body = json.loads(request.content)
            except ValueError as exc:
                raise ApiFailure(400, "BadRequest", f"invalid body: {exc}") from exc
        if sub not in (None, "status"):
            raise ApiFailure(404, "NotFound", f"subresource {sub} not supported by the fake")
        if method == "GET" and name is None:
            if params.get("watch") in ("true", "1"):
                return self._watch(kind, namespace, params)
            return self._json(200, self.list(kind, namespace, params))
        if method == "GET":
            obj = self.get(group, kind.plural, ns, name or "")
            if obj is None:
                raise ApiFailure(404, "NotFound", f'{resource_text(kind)} "{name}" not found',
                                 details=status_details(kind, name or ""))
            return self._json(200, obj)
        if method == "POST" and name is None:
            if params.get("dryRun") == "All":
                return self._json(201, self.dry_run_create(kind, ns, body))
            return self._json(201, self.create(group, kind.plural, ns, body))
        if name is None:
            raise ApiFailure(405, "MethodNotAllowed", "method not allowed on a collection")
        if method == "PUT":
            expect = (body.get("metadata") or {}).get("resourceVersion")

            def replace(obj: Obj) -> None:
                obj.clear()
                obj.update(copy.deepcopy(body))

            status = True if sub == "status" else (False if kind.status else None)
            return self._json(200, self.update(group, kind.plural, ns, name, replace, status=status,
                                               expect_rv=expect or None))
        if method == "PATCH":
            ctype = request.headers.get("content-type", "").split(";")[0]
            if ctype == "application/apply-patch+yaml":
                manager = params.get("fieldManager")
                if not manager:
                    raise ApiFailure(422, "Invalid", "fieldManager is required for apply requests")
                return self._json(200, self.apply(kind, ns, name, body, manager,
                                                  params.get("force") == "true", subresource=sub))
            if ctype == "application/merge-patch+json":
                expect = (body.get("metadata") or {}).get("resourceVersion")

                def patch(obj: Obj) -> None:
                    merged = merge_patch(obj, body)
                    obj.clear()
                    obj.update(merged)

                status = True if sub == "status" else (False if kind.status else None)
                return self._json(200, self.update(group, kind.plural, ns, name, patch, status=status,
                                                   expect_rv=expect or None))
            raise ApiFailure(415, "UnsupportedMediaType",
                             f"the body of the request was in an unknown format - accepted media types "
                             f"include: application/merge-patch+json, application/apply-patch+yaml (got {ctype})")
        if method == "DELETE":
            grace = body.get("gracePeriodSeconds")
            pre = body.get("preconditions") or {}
            return self._json(200, self.delete(group, kind.plural, ns, name,
                                               grace=int(grace) if grace is not None else None,
                                               uid=pre.get("uid"), resource_version=pre.get("resourceVersion"),
                                               propagation=body.get("propagationPolicy")
                                               or params.get("propagationPolicy")))
        raise ApiFailure(405, "MethodNotAllowed", f"method {method} not allowed")

    def _watch(self, kind: Kind, namespace: str | None, params: Mapping[str, str]) -> httpx2.Response:
        selector = parse_selector(params.get("labelSelector", ""))
        timeout = float(params.get("timeoutSeconds") or 300)
        rv_text = params.get("resourceVersion") or ""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Obj] | None] = asyncio.Queue()
        with self._lock:
            if rv_text and rv_text != "0":
                rv = int(rv_text)
                if rv < self.compacted_below:
                    raise ApiFailure(410, "Expired", f"too old resource version: {rv}")
                for hrv, etype, key, obj in self._history:
                    if hrv <= rv or key[0] != kind.group or key[1] != kind.plural:
                        continue
                    if namespace and key[2] != namespace:
                        continue
                    if matches(obj["metadata"].get("labels") or {}, selector):
                        queue.put_nowait((etype, copy.deepcopy(obj)))
            else:
                for key in self._candidates(kind, namespace, selector, "", 0):
                    live = self._objects.get(key)
                    if live and matches(live["metadata"].get("labels") or {}, selector):
                        queue.put_nowait(("ADDED", copy.deepcopy(live)))
            watcher = _Watcher(kind, namespace, selector, loop, queue)
            self._watchers.append(watcher)

        async def stream() -> AsyncIterator[bytes]:
            deadline = loop.time() + timeout
            try:
                while True:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        return
                    try:
                        item = await asyncio.wait_for(queue.get(), remaining)
                    except TimeoutError:
                        return
                    if item is None:
                        return
                    etype, obj = item
                    yield (json.dumps({"type": etype, "object": obj}) + "\n").encode()
            finally:
                with self._lock:
                    if watcher in self._watchers:
                        self._watchers.remove(watcher)

        return httpx2.Response(200, content=stream(), headers={"Content-Type": "application/json"})

    def close_watches(self) -> None:
        """End every open watch (as an API server restart would)."""
        with self._lock:
            for w in self._watchers:
                w.loop.call_soon_threadsafe(w.queue.put_nowait, None)
            self._watchers.clear()

    def compact(self) -> None:
        """Forget history up to now: older Exact reads, continue tokens and watches get 410."""
        with self._lock:
            self.compacted_below = self._rv
            self._history.clear()
            for key in list(self._versions):
                obj = self._objects.get(key)
                self._versions[key] = [(int(obj["metadata"]["resourceVersion"]), copy.deepcopy(obj))] if obj else []

CONFIGMAP_DATA_LIMIT = 1024 * 1024
"""ConfigMap ``data`` values plus decoded ``binaryData`` (keys are not counted), as core validation counts."""
ANNOTATIONS_LIMIT = 256 * 1024
"""All annotation keys and values of one object together (object-meta validation)."""
ETCD_REQUEST_LIMIT = 1536 * 1024
"""etcd's default ``--max-request-bytes``: a larger write fails with "etcdserver: request is too large"."""
ETCD_SEND_LIMIT = 2 * 1024 * 1024
"""The API server's etcd client refuses to send a gRPC message larger than this."""
ETCD_SIZE_ADJUST = -41
"""The real write's gRPC message size minus this fake's estimate (its JSON plus the storage key), measured
on the real testbed with ConfigMaps of 22,000 to 36,000 keys: the real limits fall on the same object."""
REQUEST_BODY_LIMIT = 3 * 1024 * 1024
"""The API server reads at most this much of a request body (413 beyond)."""


def check_size(kind: Kind, key: Key, obj: Obj, *, stored: bool = True) -> None:
    """Refuse what the real API server refuses for size: annotations over 256 KiB and a ConfigMap over
    1 MiB of data (422, by validation), and a write larger than etcd accepts (500, from etcd or its client).

    The real server stores managed fields too, except when a create, update or merge patch is retried
    without them after etcd refused it; this fake keeps none, so a server-side apply of a large object
    fails later here than on the real server.
    """
    name = (obj.get("metadata") or {}).get("name", "")
    what = kind.kind if not kind.group else f"{kind.kind}.{kind.group}"
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    if sum(len(str(a).encode()) + len(str(v).encode()) for a, v in annotations.items()) > ANNOTATIONS_LIMIT:
        message = f"Too long: may not be more than {ANNOTATIONS_LIMIT} bytes"
        raise ApiFailure(422, "Invalid", f'{what} "{name}" is invalid: metadata.annotations: {message}',
                         [{"reason": "FieldValueTooLong", "message": message, "field": "metadata.annotations"}],
                         details={"name": name, "group": kind.group, "kind": kind.kind} if kind.group
                         else {"name": name, "kind": kind.kind})
    if kind.group == "" and kind.plural == "configmaps":
        total = sum(len(str(v).encode()) for v in (obj.get("data") or {}).values())
        for value in (obj.get("binaryData") or {}).values():
            try:
                total += len(base64.b64decode(str(value), validate=True))
            except ValueError:
                total += len(str(value))
        if total > CONFIGMAP_DATA_LIMIT:
            message = f"Too long: may not be more than {CONFIGMAP_DATA_LIMIT} bytes"
            raise ApiFailure(422, "Invalid", f'ConfigMap "{name}" is invalid: []: {message}',
                             [{"reason": "FieldValueTooLong", "message": message, "field": "[]"}],
                             details={"name": name, "kind": "ConfigMap"})
    if stored:
        storage_key = f"/registry/{kind.group + '/' if kind.group else ''}{kind.plural}/" + (
            f"{key[2]}/{key[3]}" if key[2] else key[3])
        size = len(json.dumps(obj, separators=(",", ":")).encode()) + len(storage_key) + ETCD_SIZE_ADJUST
        if size > ETCD_SEND_LIMIT:
            raise ApiFailure(500, "", "rpc error: code = ResourceExhausted desc = trying to send message larger "
                                      f"than max ({size} vs. {ETCD_SEND_LIMIT})")
        if size > ETCD_REQUEST_LIMIT:
            raise ApiFailure(500, "", "etcdserver: request is too large")


def _strip_identity(config: Obj) -> Obj:
    out = copy.deepcopy(config)
    out.pop("apiVersion", None)
    out.pop("kind", None)
    meta = out.get("metadata")
    if isinstance(meta, dict):
        for k in ("name", "namespace", "resourceVersion", "uid", "creationTimestamp", "generation",
                  "managedFields"):
            meta.pop(k, None)
        if not meta:
            out.pop("metadata")
    return out

__all__ = ["ApiFailure", "FakeApiServer", "Fault", "Kind", "matches", "merge_patch", "parse_selector"]

