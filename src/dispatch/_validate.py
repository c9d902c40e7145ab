"""Every field of a ``JobSpec``, checked before any request.

Pure functions: each returns the problems it finds, so one ``InvalidInput`` names every bad field at once.
The rules are the API server's own (label values and keys, quantities, env var names), applied here because
a TrainJob that passes the API server can still fail later, when JobSet creates its pods, with nobody there to
read the message; and because Python's duck typing would otherwise turn a wrong type into something else
(``command="python train.py"`` iterates as one element per character).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

from . import _names as n
from ._records import JobSpec, Toleration, Volume
from ._trainer import ENV_FROM_LABELS, ENV_PREFIX, TRAINER_CONTAINER, RuntimeShape
from .errors import FieldCause

_QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": Decimal("0.001"), "": Decimal(1), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6,
            "G": Decimal(10) ** 9, "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18}
_STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_ANNOTATIONS_LIMIT = 256 * 1024
"""The API server's limit on the total size of an object's annotations (keys plus values)."""
_RESERVED_LABELS = {
    n.KUEUE_QUEUE_LABEL: "set queue= instead",
    n.KUEUE_PRIORITY_LABEL: "set priority_class= instead",
    n.JOBSET_NAME_LABEL: "JobSet sets it",
}

INT32_MAX = 2**31 - 1
"""``spec.trainer.numNodes`` is an int32 in Trainer's API."""
INT64_MAX = 2**63 - 1
"""A pod's ``terminationGracePeriodSeconds`` is an int64; a quantity's value is capped there too."""
OBJECT_LIMIT = 1536 * 1024
"""etcd's default ``--max-request-bytes``, the most the API server can store as one object (its own request
body limit, 3 MiB, is larger). A spec whose text alone is larger can never be created, and the server's
answer would be a 500 that reads as "retry": refused before anything is built instead (a few aliases in a
YAML file can expand to hundreds of megabytes)."""
_TEXT_COST = 4
"""What each piece of text costs beyond itself in the TrainJob's JSON (quotes, separators)."""
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters other than tab and newline: a NUL cannot reach a process through exec, and the rest
are never meant (a stray escape, a pasted terminal sequence); refused rather than sent on or stripped."""
_ENV_FROM_LABELS = dict(ENV_FROM_LABELS)

Problems = list[FieldCause]
T = TypeVar("T")


def _kind(value: object) -> str:
    """``int 2``, ``str 'x'``: what was given, for messages."""
    return f"{type(value).__name__} {value!r}"


def _bad(problems: Problems, field: str, message: str, reason: str = "FieldValueInvalid") -> None:
    problems.append(FieldCause(field, message, reason))


def qualified_name_problem(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes qualified name (label, annotation and node-selector keys), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash:
        if not prefix:
            return "has an empty prefix before '/'"
        problem = n.dns1123_subdomain_problem(prefix)
        if problem:
            return f"has a prefix {prefix!r} that {problem} (a DNS subdomain)"
    if not name:
        return "must not be empty" if not slash else "has an empty name after '/'"
    if len(name) > 63:
        return f"has a name part of {len(name)} characters (at most 63)"
    if not _QUALIFIED_NAME_PART.match(name):
        return ("must be an optional DNS-subdomain prefix and '/', then alphanumerics, '-', '_' or '.', "
                "starting and ending with an alphanumeric")
    return None


def env_name_problem(name: str) -> str | None:
    """Why ``name`` is not an environment variable name every Kubernetes version accepts, or None."""
    if not name:
        return "must not be empty"
    if not _ENV_NAME.match(name):
        return "must consist of letters, digits, '_', '-' or '.', and must not start with a digit"
    return None


def parse_quantity(text: str) -> Decimal | None:
    """A Kubernetes resource quantity's value (``500m`` -> 0.5, ``1Gi`` -> 1073741824), or None if
    ``text`` does not follow the quantity grammar."""
    match = _QUANTITY.match(text)
    if not match:
        return None
    try:
        number = Decimal(match["number"])
    except InvalidOperation:
        return None
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        value = number * _BINARY[suffix]
    elif suffix in _DECIMAL:
        value = number * _DECIMAL[suffix]
    else:
        value = number * Decimal(10) ** int(suffix[1:])
    return -value if match["sign"] == "-" else value


def _resource_name_problem(name: str) -> str | None:
    if "/" in name:
        return qualified_name_problem(name)
    if name in _STANDARD_RESOURCES or (name.startswith("hugepages-") and parse_quantity(name[10:]) is not None):
        return None
    return ("is not a standard resource (cpu, memory, ephemeral-storage, hugepages-<size>) "
            "nor a qualified extended resource such as nvidia.com/gpu")


def _text(problems: Problems, field: str, value: object, *, optional: bool = False) -> str | None:
    """``value`` if it is a str; else a problem naming the type."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        _bad(problems, field, f"must be a string (got {_kind(value)})", "FieldValueTypeInvalid")
        return None
    return value


def _int(problems: Problems, field: str, value: object, minimum: int, maximum: int, api_type: str) -> None:
    """An int within the API's type: Python's ints are unbounded, the API server's are not."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        _bad(problems, field, f"must be an int (got {_kind(value)})", "FieldValueTypeInvalid")
    elif value < minimum:
        _bad(problems, field, f"must be at least {minimum} (got {value})" if minimum else
             f"must not be negative (got {value})")
    elif value > maximum:
        _bad(problems, field, f"must be at most {maximum}, the largest {api_type} the API takes (got {value})")


def control_problem(text: str) -> str | None:
    """Why ``text`` may not be sent (a control character other than tab or newline), or None."""
    found = _CONTROL.search(text)
    if found is None:
        return None
    return f"contains the control character U+{ord(found.group()):04X} at offset {found.start()}"


def _no_control(problems: Problems, field: str, text: str) -> None:
    if problem := control_problem(text):
        _bad(problems, field, problem)


def _str_map(problems: Problems, field: str, value: object) -> list[tuple[str, str]]:
    """The str -> str entries of a mapping; problems for anything else (each entry named)."""
    if not isinstance(value, Mapping):
        _bad(problems, field, f"must be a mapping of strings to strings (got {type(value).__name__})",
             "FieldValueTypeInvalid")
        return []
    out = []
    for key, item in value.items():
        if not isinstance(key, str):
            _bad(problems, f"{field}[{key!r}]", f"keys must be strings (got {_kind(key)})", "FieldValueTypeInvalid")
        elif not isinstance(item, str):
            _bad(problems, f"{field}[{key}]", f"must be a string (got {_kind(item)}); pass {str(item)!r} if "
                 "that is the text you mean", "FieldValueTypeInvalid")
        else:
            out.append((key, item))
    return out


def _str_list(problems: Problems, field: str, value: object) -> None:
    if isinstance(value, str | bytes):
        _bad(problems, field, f"must be a list of strings, not one string (got {value!r}); a string would be "
             f"sent one character per element: pass a list such as {value.split()!r} or shlex.split(...)"
             if isinstance(value, str) else f"must be a list of strings (got {_kind(value)})",
             "FieldValueTypeInvalid")
        return
    if not isinstance(value, Sequence):
        _bad(problems, field, f"must be a list of strings (got {type(value).__name__})", "FieldValueTypeInvalid")
        return
    for i, item in enumerate(value):
        if not isinstance(item, str):
            _bad(problems, f"{field}[{i}]", f"must be a string (got {_kind(item)})", "FieldValueTypeInvalid")
        else:
            _no_control(problems, f"{field}[{i}]", item)


def _ids(problems: Problems, spec: JobSpec) -> None:
    for field, value in (("job_id", spec.job_id), ("submission", spec.submission)):
        text = _text(problems, field, value)
        if text is None:
            continue
        if not text:
            _bad(problems, field, "must not be empty", "FieldValueRequired")
            continue
        problem = n.label_value_problem(text)
        if problem:
            _bad(problems, field, f"{text!r} is not a valid label value: {problem}")


def _name(problems: Problems, spec: JobSpec) -> str:
    name = _text(problems, "name", spec.name, optional=True)
    if spec.name is not None and name is None:
        return ""
    if name is None:
        if not isinstance(spec.job_id, str) or not isinstance(spec.submission, str):
            return ""
        name = n.derive_name(spec.job_id, spec.submission)
    problem = n.dns1035_problem(name)
    if problem and not any(p.field in ("job_id", "submission") for p in problems):
        hint = "" if spec.name else " (derived as <job_id>-<submission>; pass name= to choose another)"
        _bad(problems, "name", f"{name!r} is not a valid TrainJob name: {problem}{hint}")
    return name


def _runtime(problems: Problems, spec: JobSpec) -> None:
    runtime = _text(problems, "runtime", spec.runtime)
    if runtime is not None:
        problem = n.dns1123_subdomain_problem(runtime)
        if problem:
            _bad(problems, "runtime", f"{runtime!r} {problem}")
    if spec.runtime_kind not in ("ClusterTrainingRuntime", "TrainingRuntime"):
        _bad(problems, "runtime_kind", f"must be ClusterTrainingRuntime or TrainingRuntime (got {spec.runtime_kind!r})",
             "FieldValueNotSupported")


def _image(problems: Problems, spec: JobSpec) -> None:
    image = _text(problems, "image", spec.image, optional=True)
    if image is None:
        return
    if not image:
        _bad(problems, "image", "must not be empty; pass None to use the runtime's image", "FieldValueRequired")
    elif any(c.isspace() for c in image):
        _bad(problems, "image", f"{image!r} must not contain whitespace")
    else:
        _no_control(problems, "image", image)


def _kueue(problems: Problems, spec: JobSpec) -> None:
    for field, value in (("queue", spec.queue), ("priority_class", spec.priority_class)):
        text = _text(problems, field, value, optional=True)
        if text is None:
            continue
        problem = n.dns1123_subdomain_problem(text) or n.label_value_problem(text)
        if problem:
            _bad(problems, field, f"{text!r} {problem}")


KUEUE_DROPS_GRACE = (
    "is not kept under a queue: Kueue admits a TrainJob with a whole-object update built on its own copy of "
    "Trainer's API (v2.2 in Kueue v0.17 to v0.19), which drops terminationGracePeriodSeconds from every "
    "runtime patch, and the TrainJob then never starts (its JobSet's grace period is immutable); set it in "
    "the training runtime instead"
)


def _grace_under_kueue(problems: Problems, spec: JobSpec) -> None:
    """Found on the testbed's newer stack (docs/findings.md, "Two stacks"): refused before anything is
    written, rather than a TrainJob that Kueue admits and that never runs."""
    if spec.queue is not None and isinstance(spec.termination_grace_period_seconds, int):
        _bad(problems, "termination_grace_period_seconds", KUEUE_DROPS_GRACE, "FieldValueNotSupported")


_MILLI = Decimal("0.001")


def _resources(problems: Problems, spec: JobSpec) -> None:
    for key, value in _str_map(problems, "resources_per_node", spec.resources_per_node):
        field = f"resources_per_node[{key}]"
        problem = _resource_name_problem(key)
        if problem:
            _bad(problems, field, f"resource name {key!r} {problem}")
            continue
        quantity = parse_quantity(value)
        if quantity is None:
            _bad(problems, field, f"{value!r} is not a quantity (such as 2, 500m, 4Gi or 1e3)")
        elif quantity < 0:
            _bad(problems, field, f"{value!r} must not be negative")
        elif quantity > INT64_MAX:
            # The API server caps a larger quantity at 2^63-1 rather than refusing it.
            _bad(problems, field, f"{value!r} is more than {INT64_MAX}, the largest quantity the API keeps")
        elif quantity % _MILLI:
            # The API server rounds a finer quantity up to the next thousandth (0.1m becomes 1m).
            _bad(problems, field, f"{value!r} is finer than a thousandth (1m); the API would round it up")
        elif "/" in key and not key.startswith("kubernetes.io/") and quantity != quantity.to_integral_value():
            _bad(problems, field, f"{value!r} must be a whole number for an extended resource")


def _env(problems: Problems, spec: JobSpec) -> None:
    for key, value in _str_map(problems, "env", spec.env):
        field = f"env[{key}]"
        if problem := env_name_problem(key):
            _bad(problems, field, f"{key!r} is not an environment variable name: {problem}")
        elif key in _ENV_FROM_LABELS:
            # As enrolment refuses it: the trainer would get two entries, and A must come from the pod's label.
            _bad(problems, field, f"is set by dispatch from the pod's label {_ENV_FROM_LABELS[key]}",
                 "FieldValueForbidden")
        elif key.startswith(ENV_PREFIX):
            _bad(problems, field, f"is reserved for dispatch (variables starting {ENV_PREFIX})", "FieldValueForbidden")
        else:
            _no_control(problems, field, value)


def _labels(problems: Problems, spec: JobSpec) -> None:
    for key, value in _str_map(problems, "labels", spec.labels):
        field = f"labels[{key}]"
        if key.startswith(n.DOMAIN + "/"):
            _bad(problems, field, "is reserved for dispatch", "FieldValueForbidden")
        elif key in _RESERVED_LABELS:
            _bad(problems, field, f"is set by dispatch from the spec: {_RESERVED_LABELS[key]}", "FieldValueForbidden")
        elif problem := qualified_name_problem(key):
            _bad(problems, field, f"key {key!r} {problem}")
        elif problem := n.label_value_problem(value):
            _bad(problems, field, f"{value!r} is not a valid label value: {problem}")


def _pod_annotations(problems: Problems, spec: JobSpec) -> None:
    total = 0
    for key, value in _str_map(problems, "pod_annotations", spec.pod_annotations):
        total += len(key) + len(value)
        if key.startswith(n.DOMAIN + "/"):
            _bad(problems, f"pod_annotations[{key}]", "is reserved for dispatch", "FieldValueForbidden")
        elif problem := qualified_name_problem(key):
            _bad(problems, f"pod_annotations[{key}]", f"key {key!r} {problem}")
        else:
            _no_control(problems, f"pod_annotations[{key}]", value)
    if total > _ANNOTATIONS_LIMIT:
        _bad(problems, "pod_annotations", f"total {total} bytes, more than the API's {_ANNOTATIONS_LIMIT}",
             "FieldValueTooLong")


def _node_selector(problems: Problems, spec: JobSpec) -> None:
    for key, value in _str_map(problems, "node_selector", spec.node_selector):
        field = f"node_selector[{key}]"
        if problem := qualified_name_problem(key):
            _bad(problems, field, f"key {key!r} {problem}")
        elif problem := n.label_value_problem(value):
            _bad(problems, field, f"{value!r} is not a valid label value: {problem}")


_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_OPERATORS = ("Equal", "Exists")
MAX_VOLUMES = 128
"""Trainer's CRD: at most 128 volumes, mounts and tolerations in a runtime patch; 64 image pull secrets."""
MAX_PULL_SECRETS = 64


def _dns_label(problems: Problems, field: str, value: str, what: str) -> None:
    """A DNS-1123 label (a volume's name): lowercase alphanumerics and '-', at most 63."""
    if not value:
        _bad(problems, field, "must not be empty", "FieldValueRequired")
    elif len(value) > 63 or n.dns1123_subdomain_problem(value) or "." in value:
        _bad(problems, field, f"{value!r} is not a valid {what}: lowercase letters, digits and '-', starting and "
             "ending with a letter or digit, at most 63 characters")


def _object_name(problems: Problems, field: str, value: object, what: str) -> str | None:
    """The name of an object the pods refer to (a claim, a Secret): a DNS-1123 subdomain."""
    name = _text(problems, field, value)
    if name is None:
        return None
    if not name:
        _bad(problems, field, f"must not be empty: the {what}'s name", "FieldValueRequired")
    elif problem := n.dns1123_subdomain_problem(name):
        _bad(problems, field, f"{name!r} is not a valid {what} name: {problem}")
    return name


def _relative_path(problems: Problems, field: str, value: str) -> None:
    if not value:
        _bad(problems, field, "must not be empty; leave it unset to mount the whole volume", "FieldValueRequired")
    elif value.startswith("/"):
        _bad(problems, field, f"{value!r} must be a relative path inside the volume")
    elif ".." in value.split("/"):
        _bad(problems, field, f"{value!r} must not contain '..'")
    else:
        _no_control(problems, field, value)


def _items(problems: Problems, field: str, values: object, kind: type[T]) -> Iterator[tuple[str, T]]:
    """The items of a list of ``kind`` (volumes, tolerations), each with its field (``volumes[0]``); one
    not of ``kind`` is named and passed over. A generator, so each item's problems follow its own place
    in the list."""
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Sequence):
        _bad(problems, field, f"must be a list of dispatch.{kind.__name__} (got {type(values).__name__})",
             "FieldValueTypeInvalid")
        return
    if len(values) > MAX_VOLUMES:
        _bad(problems, field, f"{len(values)} {field}, more than Trainer's {MAX_VOLUMES}", "FieldValueTooMany")
    for i, value in enumerate(values):
        if isinstance(value, kind):
            yield f"{field}[{i}]", value
        else:
            _bad(problems, f"{field}[{i}]", f"must be a dispatch.{kind.__name__} (got {type(value).__name__})",
                 "FieldValueTypeInvalid")


def _volumes(problems: Problems, spec: JobSpec) -> None:
    """Each volume: a valid unique name, an absolute unique mount path, exactly one source."""
    names: set[str] = set()
    paths: set[str] = set()
    for field, volume in _items(problems, "volumes", spec.volumes, Volume):
        name = _text(problems, f"{field}.name", volume.name)
        if name is not None:
            _dns_label(problems, f"{field}.name", name, "volume name")
            if name in names:
                _bad(problems, f"{field}.name", f"{name!r} is given twice", "FieldValueDuplicate")
            names.add(name)
        path = _text(problems, f"{field}.mount_path", volume.mount_path)
        if path is not None:
            if not path.startswith("/"):
                _bad(problems, f"{field}.mount_path", f"{path!r} must be an absolute path (starting with '/')"
                     if path else "must not be empty", "FieldValueInvalid" if path else "FieldValueRequired")
            elif ":" in path:
                _bad(problems, f"{field}.mount_path", f"{path!r} must not contain ':'")
            else:
                _no_control(problems, f"{field}.mount_path", path)
                normal = path.rstrip("/") or "/"
                if normal in paths:
                    _bad(problems, f"{field}.mount_path", f"{path!r} is mounted twice", "FieldValueDuplicate")
                paths.add(normal)
        sources = [key for key, given in (("claim", volume.claim is not None),
                                          ("config_map", volume.config_map is not None),
                                          ("secret", volume.secret is not None),
                                          ("empty_dir", volume.empty_dir is not False)) if given]
        if len(sources) != 1:
            _bad(problems, field, "must have exactly one source: claim, config_map, secret or empty_dir (got "
                 + (", ".join(sources) if sources else "none") + ")",
                 "FieldValueRequired" if not sources else "FieldValueForbidden")
        for key, what in (("claim", "PersistentVolumeClaim"), ("config_map", "ConfigMap"), ("secret", "Secret")):
            if getattr(volume, key) is not None:
                _object_name(problems, f"{field}.{key}", getattr(volume, key), what)
        for key in ("empty_dir", "read_only"):
            if not isinstance(getattr(volume, key), bool):
                _bad(problems, f"{field}.{key}", f"must be a bool (got {_kind(getattr(volume, key))})",
                     "FieldValueTypeInvalid")
        if volume.sub_path is not None:
            sub = _text(problems, f"{field}.sub_path", volume.sub_path)
            if sub is not None:
                _relative_path(problems, f"{field}.sub_path", sub)


def _tolerations(problems: Problems, spec: JobSpec) -> None:
    """The API server's rules for tolerations (``ValidateTolerations``), checked before any request."""
    for field, tol in _items(problems, "tolerations", spec.tolerations, Toleration):
        key = _text(problems, f"{field}.key", tol.key)
        operator = _text(problems, f"{field}.operator", tol.operator)
        value = _text(problems, f"{field}.value", tol.value)
        effect = _text(problems, f"{field}.effect", tol.effect)
        if key and (problem := qualified_name_problem(key)):
            _bad(problems, f"{field}.key", f"key {key!r} {problem}")
        if operator is not None and operator not in _OPERATORS:
            _bad(problems, f"{field}.operator", f"must be Equal or Exists (got {operator!r})", "FieldValueNotSupported")
        elif operator == "Exists" and value:
            _bad(problems, f"{field}.value", f"must be empty when the operator is Exists (got {value!r})")
        elif operator == "Equal" and value is not None and (problem := n.label_value_problem(value)):
            _bad(problems, f"{field}.value", f"{value!r} is not a valid label value: {problem}")
        if key == "" and operator == "Equal":
            _bad(problems, f"{field}.operator", "must be Exists when the key is empty (an empty key with Exists "
                 "tolerates every taint)")
        if effect is not None and effect and effect not in _EFFECTS:
            _bad(problems, f"{field}.effect", f"must be empty, {', '.join(_EFFECTS)} (got {effect!r})",
                 "FieldValueNotSupported")
        if tol.seconds is not None:
            _int(problems, f"{field}.seconds", tol.seconds, -(2**63), INT64_MAX, "int64")
            if effect != "NoExecute":
                _bad(problems, f"{field}.seconds", "is taken only with the effect NoExecute (tolerationSeconds)",
                     "FieldValueForbidden")


def _pod_identity(problems: Problems, spec: JobSpec) -> None:
    """The service account and image pull secrets: names of objects of the namespace."""
    if spec.service_account is not None:
        _object_name(problems, "service_account", spec.service_account, "ServiceAccount")
    secrets = spec.image_pull_secrets
    if isinstance(secrets, str | bytes) or not isinstance(secrets, Sequence):
        _bad(problems, "image_pull_secrets", "must be a list of Secret names"
             + (f", not one string (pass [{secrets!r}])" if isinstance(secrets, str) else
                f" (got {type(secrets).__name__})"), "FieldValueTypeInvalid")
        return
    if len(secrets) > MAX_PULL_SECRETS:
        _bad(problems, "image_pull_secrets", f"{len(secrets)} secrets, more than Trainer's {MAX_PULL_SECRETS}",
             "FieldValueTooMany")
    seen: set[str] = set()
    for i, secret in enumerate(secrets):
        name = _object_name(problems, f"image_pull_secrets[{i}]", secret, "Secret")
        if name:
            if name in seen:
                _bad(problems, f"image_pull_secrets[{i}]", f"{name!r} is given twice", "FieldValueDuplicate")
            seen.add(name)


def runtime_problems(spec: JobSpec, shape: RuntimeShape, runtime: str) -> Problems:
    """What of ``spec`` the runtime cannot take: volumes with no trainer container to mount them in, or
    whose name or mount path the runtime's pod template already uses (JobSet would fail to make the pods,
    later, with nobody there to read why)."""
    problems: Problems = []
    if not spec.volumes:
        return problems
    jobs = shape.trainer_jobs
    if not jobs:
        _bad(problems, "volumes", f"{runtime} has no container named {TRAINER_CONTAINER!r} (Trainer's trainer "
             "container) to mount them in", "FieldValueNotSupported")
        return problems
    for i, volume in enumerate(spec.volumes):
        for job in jobs:
            if volume.name in shape.volumes.get(job, ()):
                _bad(problems, f"volumes[{i}].name", f"{volume.name!r} is a volume of {runtime}'s job {job} already; "
                     "choose another name", "FieldValueDuplicate")
                break
            normal = volume.mount_path.rstrip("/") or "/"
            if normal in {m.rstrip("/") or "/" for m in shape.mounts.get(job, ())}:
                _bad(problems, f"volumes[{i}].mount_path", f"{volume.mount_path!r} is mounted by {runtime}'s job "
                     f"{job} already", "FieldValueDuplicate")
                break
    return problems


def _texts(spec: JobSpec) -> Iterator[object]:
    """Every piece of text the TrainJob will carry, the same object as often as it is used."""
    yield from (spec.job_id, spec.submission, spec.name, spec.runtime, spec.image, spec.queue, spec.priority_class)
    for seq in (spec.command, spec.args):
        if isinstance(seq, Sequence) and not isinstance(seq, str | bytes):
            yield from seq
    for mapping in (spec.resources_per_node, spec.env, spec.labels, spec.pod_annotations, spec.node_selector):
        if isinstance(mapping, Mapping):
            for key, value in mapping.items():
                yield key
                yield value
    yield spec.service_account
    lists: tuple[object, ...] = (spec.volumes, spec.tolerations, spec.image_pull_secrets)
    for many in lists:
        if isinstance(many, Sequence) and not isinstance(many, str | bytes):
            for item in many:
                if isinstance(item, Volume | Toleration):
                    yield from (getattr(item, f.name) for f in dataclasses.fields(item))
                else:
                    yield item


def _size(problems: Problems, spec: JobSpec) -> None:
    """Refuse a spec whose text alone passes the object limit, counting no further than the limit."""
    total = 0
    for text in _texts(spec):
        if isinstance(text, str):
            size = len(text) if len(text) > OBJECT_LIMIT else len(text.encode("utf-8", "surrogatepass"))
            total += size + _TEXT_COST
            if total > OBJECT_LIMIT:
                _bad(problems, "spec", f"its text is more than {OBJECT_LIMIT} bytes, the most the API server can "
                     "store as one object (etcd's default request limit)", "FieldValueTooLong")
                return


def spec_problems(spec: Any) -> tuple[str, Problems]:
    """(the TrainJob name, every problem of ``spec``), without raising."""
    problems: Problems = []
    if not isinstance(spec, JobSpec):
        _bad(problems, "spec", f"must be a dispatch.JobSpec (got {type(spec).__name__})", "FieldValueTypeInvalid")
        return "", problems
    _size(problems, spec)
    if problems:  # nothing else is read of a spec that large
        return "", problems
    _ids(problems, spec)
    name = _name(problems, spec)
    _runtime(problems, spec)
    _image(problems, spec)
    _str_list(problems, "command", spec.command)
    _str_list(problems, "args", spec.args)
    _int(problems, "num_nodes", spec.num_nodes, 1, INT32_MAX, "int32")
    _int(problems, "termination_grace_period_seconds", spec.termination_grace_period_seconds, 0, INT64_MAX, "int64")
    _kueue(problems, spec)
    _grace_under_kueue(problems, spec)
    _resources(problems, spec)
    _env(problems, spec)
    _labels(problems, spec)
    _pod_annotations(problems, spec)
    _node_selector(problems, spec)
    _volumes(problems, spec)
    _tolerations(problems, spec)
    _pod_identity(problems, spec)
    return name, problems


def validate_spec(spec: JobSpec) -> str:
    """Check every field of ``spec``; return the TrainJob name. Raises InvalidInput naming each bad field."""
    name, problems = spec_problems(spec)
    n.check(problems)
    return name
