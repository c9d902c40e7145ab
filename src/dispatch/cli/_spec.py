"""``dispatch open``'s input: a small YAML spec file, flags on top of it, into a ``JobSpec``."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .._kubeconfig import yaml_problem
from .._records import JobSpec, Toleration, Volume
from .._validate import OBJECT_LIMIT, control_problem
from ..errors import FieldCause, InvalidInput

# Spec file keys (camelCase, as in Kubernetes; snake_case is accepted too) -> JobSpec fields.
SPEC_KEYS: dict[str, str] = {
    "jobId": "job_id",
    "submission": "submission",
    "name": "name",
    "runtime": "runtime",
    "runtimeKind": "runtime_kind",
    "image": "image",
    "command": "command",
    "args": "args",
    "numNodes": "num_nodes",
    "resourcesPerNode": "resources_per_node",
    "env": "env",
    "queue": "queue",
    "priorityClass": "priority_class",
    "labels": "labels",
    "podAnnotations": "pod_annotations",
    "nodeSelector": "node_selector",
    "terminationGracePeriodSeconds": "termination_grace_period_seconds",
    "volumes": "volumes",
    "tolerations": "tolerations",
    "serviceAccount": "service_account",
    "imagePullSecrets": "image_pull_secrets",
}
VOLUME_KEYS: dict[str, str] = {
    "name": "name", "mountPath": "mount_path", "claim": "claim", "configMap": "config_map", "secret": "secret",
    "emptyDir": "empty_dir", "readOnly": "read_only", "subPath": "sub_path",
}
"""A volume's keys in spec files and ``--volume`` (camelCase) -> ``Volume`` fields."""
TOLERATION_KEYS: dict[str, str] = {
    "key": "key", "operator": "operator", "value": "value", "effect": "effect", "tolerationSeconds": "seconds",
}
_BOOL_FIELDS = ("empty_dir", "read_only")
_FIELDS = set(SPEC_KEYS.values())
_MAPS = ("resources_per_node", "env", "labels", "pod_annotations", "node_selector")
_LISTS = ("volumes", "tolerations", "image_pull_secrets")
"""Fields whose flags add entries after the spec file's."""

EXAMPLE = """\
jobId: llama
submission: s1
runtime: torch-distributed
image: ghcr.io/example/train:1.0
command: [python, train.py]
args: [--epochs, "3"]
numNodes: 2
resourcesPerNode: {cpu: "2", memory: 4Gi}
env: {WANDB_MODE: offline}
queue: lq            # Kueue mode; omit for plain mode
priorityClass: high
terminationGracePeriodSeconds: 30
volumes:             # mounted in the trainer container; a PVC is the checkpoint volume
  - {name: ckpt, mountPath: /ckpt, claim: llama-ckpt}
tolerations:
  - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
serviceAccount: trainer
imagePullSecrets: [regcred]
"""


class SpecError(ValueError):
    """A spec file or flag that cannot be read; reported as a usage error."""


_NULL = "tag:yaml.org,2002:null"
_MERGE = "tag:yaml.org,2002:merge"
_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"
_BOOL = "tag:yaml.org,2002:bool"
_FLOAT = "tag:yaml.org,2002:float"
_INT_FIELDS = ("num_nodes", "termination_grace_period_seconds")
_DECIMAL = re.compile(r"^-?(0|[1-9][0-9]*)$")
"""A plain decimal integer; the library says why a negative one is refused."""
_OCTAL = re.compile(r"^-?0[0-9]+$")
_ENTRY_COST = 8
"""What each value or key taken from the file counts beyond its text (the JSON around it), so that a
spec of many tiny aliased entries meets the limit too."""


def integer_problem(written: str) -> str | None:
    """Why ``written`` is not an integer as spec files and flags take them (plain decimal digits), or None.

    One rule for both, so ``--nodes 2.0`` and ``numNodes: 2.0`` are refused alike, and ``010``, ``2_0`` or
    `` 2`` are refused rather than read as 8, 20 or 2.
    """
    if _DECIMAL.match(written):
        return None
    if _OCTAL.match(written):
        return (f"must be an integer: {written} has a leading zero, which YAML 1.1 reads as octal "
                f"({int(written, 8) if re.match(r'^-?0[0-7]+$', written) else 'not octal either'}); "
                "write it without the zero")
    return f"must be an integer, got {written!r}"


def parse_integer(option: str, written: str | None) -> int | None:
    """A flag's integer, by spec files' rule; None when the flag is not given."""
    if written is None:
        return None
    problem = integer_problem(written)
    if problem:
        raise SpecError(f"{option} {problem}")
    return int(written)


def _too_large(path: Path, node: yaml.Node | yaml.Event) -> SpecError:
    mark = node.start_mark
    return SpecError(
        f"{path} line {mark.line + 1 if mark else '?'}: the spec expands to more than {OBJECT_LIMIT} bytes "
        "(the most the API server can store as one object), through its aliases or its size"
    )


class _Loader(yaml.SafeLoader):
    """PyYAML's safe composer, noting which nodes carry an explicit tag (``!!binary``, ``!foo``), and
    counting what the document expands to as it is composed.

    A composed node keeps only its resolved tag, and a tag the spec cannot honour would otherwise be
    silently dropped (``!!binary aGk=`` sent as the text ``aGk=``). An alias costs nothing to compose but
    the whole of its anchor to send: counting it here stops a file of aliases at the limit, not after
    parsing all of it.
    """

    def __init__(self, stream: str, path: Path) -> None:
        super().__init__(stream)
        self.path = path
        self.explicit: dict[int, str] = {}
        self.sizes: dict[int, int] = {}
        self.expanded = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        node: yaml.Node | None = super().compose_node(parent, index)
        if node is None:
            return None
        if isinstance(event, yaml.AliasEvent):
            self.grow(self.sizes.get(id(node), 0), event)
            return node
        if getattr(event, "tag", None) is not None:
            self.explicit[id(node)] = event.tag
        if isinstance(node, yaml.ScalarNode):
            size = len(node.value) + _ENTRY_COST
            self.grow(size, event)
        elif isinstance(node, yaml.SequenceNode):  # its items were counted as they were composed
            size = sum(self.sizes.get(id(item), 0) for item in node.value)
        else:
            size = sum(self.sizes.get(id(k), 0) + self.sizes.get(id(v), 0) for k, v in node.value)
        self.sizes[id(node)] = min(size, OBJECT_LIMIT + 1)
        return node

    def grow(self, size: int, event: yaml.Event) -> None:
        self.expanded += size
        if self.expanded > OBJECT_LIMIT:
            raise _too_large(self.path, event)


class _File:
    """One spec file's nodes, read as written.

    PyYAML types plain scalars the YAML 1.1 way (``true``/``on``/``yes`` booleans, ``1.10`` the float 1.1,
    ``010`` the octal 8), so converting its values back to text would rewrite them. Every text field is
    taken from the node's own text instead; integer fields take plain decimal integers only.
    """

    def __init__(self, path: Path, explicit: Mapping[int, str]) -> None:
        self.path = path
        self.explicit = explicit
        self.spent = 0
        self.lines: dict[str, int] = {}
        """The line of each JobSpec field and entry (``env[A]``, ``args[1]``), as the library names them."""

    def where(self, node: yaml.Node, field: str) -> str:
        return f"{self.path} line {node.start_mark.line + 1}: {field}"

    def spend(self, node: yaml.Node, text: str) -> None:
        """Count what the file expands to, refusing it once past the API's object limit.

        Aliases make a small file large (each ``*a`` repeats its anchor's whole value, and merges repeat
        whole mappings); counting as the values are taken keeps the memory and time bounded by the limit.
        """
        self.spent += len(text) + _ENTRY_COST
        if self.spent > OBJECT_LIMIT:
            raise _too_large(self.path, node)

    def tag(self, node: yaml.Node, field: str, scalar: str = _STR) -> None:
        """Refuse an explicit tag the field cannot honour: only ``!!str`` on text (``!!int`` on integers),
        ``!!seq`` on a list and ``!!map`` on a mapping."""
        tag = self.explicit.get(id(node))
        allowed = (_MAP if isinstance(node, yaml.MappingNode) else _SEQ if isinstance(node, yaml.SequenceNode)
                   else scalar)
        if tag is None or tag == allowed:
            return
        shown = "!!" + tag[len("tag:yaml.org,2002:"):] if tag.startswith("tag:yaml.org,2002:") else tag
        raise SpecError(f"{self.where(node, field)} has the YAML tag {shown}, which a spec does not take; "
                        "write the value as plain text")

    def mapping(self, node: yaml.Node, field: str) -> list[tuple[str, yaml.Node]]:
        """(key text, value node) pairs; a key given twice is refused, ``<<`` merges are applied."""
        self.tag(node, field)
        if not isinstance(node, yaml.MappingNode):
            raise SpecError(f"{self.where(node, field)} must be a mapping of names to values")
        merged: dict[str, yaml.Node] = {}
        own: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            self.spend(key_node, "")
            if key_node.tag == _MERGE:
                self.tag(key_node, field, _MERGE)
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for source in sources:
                    for key, value in self.mapping(source, field):
                        merged.setdefault(key, value)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise SpecError(f"{self.where(key_node, field)} keys must be plain names, not lists or mappings")
            self.tag(key_node, field)
            key = key_node.value
            self.spend(key_node, key)
            if key in own:
                raise SpecError(f"{self.where(key_node, field)}: key {key!r} is given twice")
            own[key] = value_node
        return list({**merged, **own}.items())

    def text(self, node: yaml.Node, field: str) -> str:
        """A scalar's text exactly as written (quoted scalars unquoted, as YAML does)."""
        self.tag(node, field)
        if isinstance(node, yaml.ScalarNode):
            if node.tag == _NULL and node.style is None:
                raise SpecError(
                    f"{self.where(node, field)} has no value ({node.value or 'empty'}); "
                    f'write {field.rsplit(".", 1)[-1]}: "" for an empty string'
                )
            self.spend(node, node.value)
            if problem := control_problem(node.value):
                raise SpecError(f"{self.where(node, field)} {problem}; write it without")
            return str(node.value)
        shape = "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"
        raise SpecError(f"{self.where(node, field)} must be a single value, not {shape}")

    def integer(self, node: yaml.Node, field: str) -> int:
        self.tag(node, field, _INT)
        if isinstance(node, yaml.ScalarNode) and node.style is None:
            problem = integer_problem(node.value)
            if problem is None:
                return int(node.value)
            if _OCTAL.match(node.value):
                raise SpecError(f"{self.where(node, field)} {problem}")
        written = node.value if isinstance(node, yaml.ScalarNode) else "a list or mapping"
        quoted = " (quoted: write it without quotes)" if isinstance(node, yaml.ScalarNode) and node.style else ""
        raise SpecError(f"{self.where(node, field)} must be an integer, got {written!r}{quoted}")

    def note(self, name: str, node: yaml.Node) -> None:
        self.lines[name] = node.start_mark.line + 1

    def str_list(self, node: yaml.Node, field: str, name: str) -> list[str]:
        self.note(name, node)
        self.tag(node, field)
        if isinstance(node, yaml.ScalarNode) and not (node.tag == _NULL and node.style is None):
            line = self.text(node, field)
            try:
                words = shlex.split(line)
            except ValueError as exc:
                raise SpecError(f"{self.where(node, field)} cannot be split like a shell line: {exc}") from None
            for i in range(len(words)):
                self.note(f"{name}[{i}]", node)
            return words
        if isinstance(node, yaml.SequenceNode):
            out = []
            for i, item in enumerate(node.value):
                out.append(self.text(item, f"{field}[{i}]"))
                self.note(f"{name}[{i}]", item)
            return out
        raise SpecError(f"{self.where(node, field)} must be a list of strings or one string")

    def boolean(self, node: yaml.Node, field: str) -> bool:
        """``true`` or ``false`` as written (YAML 1.1's ``yes``/``on`` are refused, not read as true)."""
        self.tag(node, field, "tag:yaml.org,2002:bool")
        if isinstance(node, yaml.ScalarNode) and node.style is None and node.value in ("true", "false"):
            self.spend(node, node.value)
            return bool(node.value == "true")
        written = node.value if isinstance(node, yaml.ScalarNode) else "a list or mapping"
        raise SpecError(f"{self.where(node, field)} must be true or false, got {written!r}")

    def records(self, node: yaml.Node, field: str, name: str, keys: Mapping[str, str],
                required: Sequence[str] = ()) -> list[dict[str, Any]]:
        """A list of mappings (volumes, tolerations) into keyword arguments, each key and entry's line noted
        as the library names them (``volumes[0].mount_path``); an unknown key is refused naming it."""
        self.note(name, node)
        self.tag(node, field)
        if not isinstance(node, yaml.SequenceNode):
            raise SpecError(f"{self.where(node, field)} must be a list of mappings")
        out = []
        for i, item in enumerate(node.value):
            where, named = f"{field}[{i}]", f"{name}[{i}]"
            self.note(named, item)
            entry: dict[str, Any] = {}
            for key, value in self.mapping(item, where):
                attr = keys.get(key)
                if attr is None:
                    raise SpecError(f"{self.where(value, where)}: unknown key {key!r} (known: {', '.join(keys)})")
                self.note(f"{named}.{attr}", value)
                if attr in _BOOL_FIELDS:
                    entry[attr] = self.boolean(value, f"{where}.{key}")
                elif attr == "seconds":
                    entry[attr] = self.integer(value, f"{where}.{key}")
                else:
                    entry[attr] = self.text(value, f"{where}.{key}")
            missing = [key for key in required if keys[key] not in entry]
            if missing:
                raise SpecError(f"{self.where(item, where)} needs {' and '.join(missing)}")
            out.append(entry)
        return out

    def str_map(self, node: yaml.Node, field: str, name: str) -> dict[str, str]:
        self.note(name, node)
        out = {}
        for key, value in self.mapping(node, field):
            out[key] = self.text(value, f"{field}.{key}")
            self.note(f"{name}[{key}]", value)
        return out


def _read(path: Path) -> str:
    """The file's text, reading no more than the object limit allows (one character past it, to know)."""
    if str(path) == "-":
        return sys.stdin.read(OBJECT_LIMIT + 1)
    with path.open(encoding="utf-8") as f:
        return f.read(OBJECT_LIMIT + 1)


def load_spec_file(path: Path, lines: dict[str, int] | None = None) -> dict[str, Any]:
    """Read a spec file into JobSpec keyword arguments; unknown keys are an error naming them.

    Values reach the TrainJob exactly as written: text fields keep their text (``1.10`` stays "1.10",
    ``true`` stays "true", a key ``on`` stays "on"); integers must be written as plain decimal integers.
    A top-level key with no value counts as not given. ``lines`` receives the line of each field and
    entry, named as the library names them (``env[A]``), so its refusals can point into the file.
    """
    return _spec_values(path, *_root(path), lines)


def load_input(path: Path, lines: dict[str, int] | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``open -f``'s file: (JobSpec keyword arguments, None) for a spec file, or ({}, the manifest) for a
    whole TrainJob manifest (a mapping with ``apiVersion`` or ``kind`` at its top)."""
    root, explicit = _root(path)
    if isinstance(root, yaml.MappingNode) and any(
            isinstance(k, yaml.ScalarNode) and k.value in ("apiVersion", "kind") for k, _ in root.value):
        return {}, _manifest(_File(path, explicit), root)
    return _spec_values(path, root, explicit, lines), None


_YAML11_BOOLS = ("yes", "no", "on", "off", "y", "n")


def _manifest(doc: _File, root: yaml.Node) -> dict[str, Any]:
    """A TrainJob manifest's YAML into plain data, refusing what YAML would reshape rather than sending it.

    The JSON the API server takes has no tags, no octal or sexagesimal numbers and only ``true``/``false``
    as booleans; PyYAML reads YAML 1.1, where ``on`` is true and ``010`` is 8. Such a value, an explicit
    tag other than the plain kinds (``!!binary``), a control character, or a key given twice is refused
    naming its line; aliases count towards the object limit as they expand."""
    def value(node: yaml.Node, field: str) -> Any:
        if isinstance(node, yaml.MappingNode):
            return {key: value(item, f"{field}.{key}" if field else key)
                    for key, item in doc.mapping(node, field or "manifest")}
        if isinstance(node, yaml.SequenceNode):
            doc.tag(node, field)
            return [value(item, f"{field}[{i}]") for i, item in enumerate(node.value)]
        assert isinstance(node, yaml.ScalarNode)
        plain = node.style is None
        doc.tag(node, field, node.tag if node.tag in (_STR, _INT, _NULL, _BOOL, _FLOAT) else _STR)
        if not plain or node.tag == _STR or node.tag not in (_INT, _NULL, _BOOL, _FLOAT):
            return doc.text(node, field)
        doc.spend(node, node.value)
        written = node.value
        if node.tag == _NULL:
            return None
        if node.tag == _BOOL:
            if written.lower() in _YAML11_BOOLS:
                raise SpecError(f"{doc.where(node, field)} is {written!r}, a boolean in YAML 1.1 but text in JSON "
                                "and YAML 1.2; write true or false, or quote it")
            return written.lower() == "true"
        if node.tag == _INT:
            if integer_problem(written) is not None:
                raise SpecError(f"{doc.where(node, field)} is {written!r}, which YAML 1.1 reads as a number other "
                                "than it shows; write it in plain decimal, or quote it")
            return int(written)
        try:
            number = float(written)
        except ValueError:
            number = float("nan")
        if "_" in written or number != number or number in (float("inf"), float("-inf")):
            raise SpecError(f"{doc.where(node, field)} is {written!r}, which is no JSON number; quote it if it is "
                            "text")
        return number

    out = value(root, "")
    assert isinstance(out, dict)
    return out


def _root(path: Path) -> tuple[yaml.Node | None, dict[int, str]]:
    """The file's one YAML document, composed with its explicit tags noted and its expansion bounded."""
    try:
        text = _read(path)
    except OSError as exc:
        raise SpecError(f"cannot read spec file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise SpecError(f"spec file {path} is not UTF-8 text: {exc.reason} at byte {exc.start}") from exc
    if len(text) > OBJECT_LIMIT:
        raise SpecError(f"spec file {path} is larger than {OBJECT_LIMIT} bytes, the most the API server can "
                        "store as one object")
    loader = _Loader(text, path)
    try:
        root = loader.get_single_node()
    except yaml.YAMLError as exc:
        raise SpecError(f"spec file {path} is not valid YAML: {yaml_problem(exc)}") from exc
    finally:
        loader.dispose()
    return root, loader.explicit


def _spec_values(path: Path, root: yaml.Node | None, explicit: Mapping[int, str],
                 lines: dict[str, int] | None) -> dict[str, Any]:
    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == _NULL):
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise SpecError(f"spec file {path} must be a mapping of keys to values (see `dispatch open --help`)")
    doc = _File(path, explicit)
    if lines is not None:
        doc.lines = lines
    out: dict[str, Any] = {}
    unknown: list[str] = []
    for key, node in doc.mapping(root, "spec"):
        field = SPEC_KEYS.get(key) or (key if key in _FIELDS else None)
        if field is None:
            unknown.append(key)
            continue
        if isinstance(node, yaml.ScalarNode) and node.tag == _NULL and node.style is None:
            continue
        if field in ("command", "args"):
            out[field] = doc.str_list(node, key, field)
        elif field == "volumes":
            out[field] = [Volume(**v) for v in doc.records(node, key, field, VOLUME_KEYS, ("name", "mountPath"))]
        elif field == "tolerations":
            out[field] = [Toleration(**t) for t in doc.records(node, key, field, TOLERATION_KEYS)]
        elif field == "image_pull_secrets":
            if not isinstance(node, yaml.SequenceNode):
                raise SpecError(f"{doc.where(node, key)} must be a list of Secret names")
            out[field] = doc.str_list(node, key, field)
        elif field in _MAPS:
            out[field] = doc.str_map(node, key, field)
        elif field in _INT_FIELDS:
            out[field] = doc.integer(node, key)
            doc.note(field, node)
        else:
            out[field] = doc.text(node, key)
            doc.note(field, node)
    if unknown:
        known = ", ".join(SPEC_KEYS)
        raise SpecError(f"unknown key(s) in {path}: {', '.join(unknown)} (known: {known})")
    return out


SPLIT_FLAGS = ("--label", "--node-selector", "--resource")
"""Flags whose KEY=VALUE items may be comma-separated, as kubectl's ``run --labels`` and ``set resources
--limits`` are: their values (label values, quantities) can never hold a comma. ``--env`` and
``--pod-annotation`` take one KEY=VALUE per flag, as kubectl's ``--env`` and ``--annotations`` do, so a
value keeps its commas and '=' signs."""


def parse_pairs(option: str, values: Sequence[str], *, split: bool | None = None) -> dict[str, str]:
    """``KEY=VALUE`` items into a dict, exactly as typed (nothing stripped).

    Items split at commas only for the flags in ``SPLIT_FLAGS`` (or when ``split`` says so). A value
    splits from its key at the first '='. A key given twice with different values is refused.
    """
    comma = option in SPLIT_FLAGS if split is None else split
    out: dict[str, str] = {}
    for item in values:
        for part in item.split(",") if comma else [item]:
            key, sep, value = part.partition("=")
            if not sep or not key:
                shown = f"{part!r} (in {item!r})" if part != item else repr(part)
                many = ", comma-separated" if comma else "; one per flag"
                raise SpecError(f"{option} expects KEY=VALUE{many}, got {shown}")
            if key in out and out[key] != value:
                raise SpecError(f"{option} gives {key} twice ({out[key]!r} and {value!r})")
            out[key] = value
    return out


def parse_volume(written: str) -> Volume:
    """``--volume name=ckpt,claim=llama-ckpt,mountPath=/ckpt[,readOnly][,subPath=x]``: the spec file's keys,
    comma-separated (as ``docker run --mount`` takes them); ``readOnly`` and ``emptyDir`` alone mean true.
    Names, claims and paths hold no comma a volume can use."""
    entry: dict[str, Any] = {}
    for part in written.split(","):
        key, sep, value = part.partition("=")
        attr = VOLUME_KEYS.get(key)
        if attr is None:
            raise SpecError(f"--volume {written!r}: unknown key {key!r} (known: {', '.join(VOLUME_KEYS)})")
        if attr in entry:
            raise SpecError(f"--volume {written!r}: {key} is given twice")
        if attr in _BOOL_FIELDS:
            if sep and value not in ("true", "false"):
                raise SpecError(f"--volume {written!r}: {key} must be true or false (or alone), got {value!r}")
            entry[attr] = not sep or value == "true"
        elif not sep:
            raise SpecError(f"--volume {written!r}: {key} needs a value ({key}=...)")
        else:
            entry[attr] = value
    missing = [key for key in ("name", "mountPath") if VOLUME_KEYS[key] not in entry]
    if missing:
        raise SpecError(f"--volume {written!r} needs {' and '.join(missing)}, e.g. "
                        "--volume name=ckpt,claim=llama-ckpt,mountPath=/ckpt")
    return Volume(**entry)


_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def parse_toleration(written: str) -> Toleration:
    """``--toleration KEY[=VALUE][:EFFECT[:SECONDS]]``, as ``kubectl taint`` writes a taint: with ``=VALUE``
    the operator is Equal, without it Exists; ``*`` alone tolerates every taint (an empty key, Exists)."""
    if written == "*":
        return Toleration(operator="Exists")
    head, _, tail = written.partition(":")
    effect, _, seconds = tail.partition(":")
    key, sep, value = head.partition("=")
    if not key:
        raise SpecError(f"--toleration {written!r} needs a key (KEY[=VALUE][:EFFECT[:SECONDS]], or * for every "
                        "taint)")
    if tail and effect not in _EFFECTS:
        raise SpecError(f"--toleration {written!r}: the effect must be one of {', '.join(_EFFECTS)}, got {effect!r}")
    return Toleration(key=key, operator="Equal" if sep else "Exists", value=value, effect=effect,
                      seconds=parse_integer(f"--toleration {written!r}: SECONDS", seconds) if seconds else None)


def locate(exc: InvalidInput, path: Path, lines: Mapping[str, int], flags: Mapping[str, Any]) -> InvalidInput:
    """``exc`` with each cause whose value came from the spec file named by its file and line.

    A value a flag gave (or overrode) keeps its field name alone: it is not in the file.
    """
    def line(field: str) -> int | None:
        top = field.split("[", 1)[0]
        given = flags.get(top)
        if top in _LISTS:
            from_flags = False  # the file's entries come first; the flags' have no line
        elif top in _MAPS:
            from_flags = bool(given) and (field == top or field[len(top) + 1:-1] in (given or {}))
        else:
            from_flags = bool(given) if top in ("command", "args") else given is not None
        return None if from_flags else lines.get(field)

    causes = []
    for cause in exc.causes:
        found = line(cause.field)
        located = cause.field if found is None else f"{path} line {found}: {cause.field}"
        causes.append(FieldCause(located, cause.message, cause.reason))
    return InvalidInput(exc.message, reason=exc.reason, code=exc.code, causes=causes)


def build_spec(file_values: Mapping[str, Any], flag_values: Mapping[str, Any]) -> JobSpec:
    """Flags win over the file; job-id and submission must come from one of them."""
    merged: dict[str, Any] = dict(file_values)
    for key, value in flag_values.items():
        if value is None:
            continue
        if key in _MAPS:
            if value:
                merged[key] = {**merged.get(key, {}), **value}
            continue
        if key in ("command", "args") and not value:
            continue
        if key in _LISTS:
            if value:
                merged[key] = [*merged.get(key, ()), *value]
            continue
        merged[key] = value
    missing = [flag for flag, key in (("--job-id", "job_id"), ("--submission", "submission")) if not merged.get(key)]
    if missing:
        raise SpecError(f"missing {' and '.join(missing)} (give them as flags or in the spec file)")
    return JobSpec(**merged)
