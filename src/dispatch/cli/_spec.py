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
from .._records import JobSpec

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
}
_FIELDS = set(SPEC_KEYS.values())
_MAPS = ("resources_per_node", "env", "labels", "pod_annotations", "node_selector")

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
"""


class SpecError(ValueError):
    """A spec file or flag that cannot be read; reported as a usage error."""


_NULL = "tag:yaml.org,2002:null"
_MERGE = "tag:yaml.org,2002:merge"
_INT_FIELDS = ("num_nodes", "termination_grace_period_seconds")
_DECIMAL = re.compile(r"^-?(0|[1-9][0-9]*)$")
"""A plain decimal integer; the library says why a negative one is refused."""


class _File:
    """One spec file's nodes, read as written.

    PyYAML types plain scalars the YAML 1.1 way (``true``/``on``/``yes`` booleans, ``1.10`` the float 1.1,
    ``010`` the octal 8), so converting its values back to text would rewrite them. Every text field is
    taken from the node's own text instead; integer fields take plain decimal integers only.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def where(self, node: yaml.Node, field: str) -> str:
        return f"{self.path} line {node.start_mark.line + 1}: {field}"

    def mapping(self, node: yaml.Node, field: str) -> list[tuple[str, yaml.Node]]:
        """(key text, value node) pairs; a key given twice is refused, ``<<`` merges are applied."""
        if not isinstance(node, yaml.MappingNode):
            raise SpecError(f"{self.where(node, field)} must be a mapping of names to values")
        merged: dict[str, yaml.Node] = {}
        own: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for source in sources:
                    for key, value in self.mapping(source, field):
                        merged.setdefault(key, value)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise SpecError(f"{self.where(key_node, field)} keys must be plain names, not lists or mappings")
            key = key_node.value
            if key in own:
                raise SpecError(f"{self.where(key_node, field)}: key {key!r} is given twice")
            own[key] = value_node
        return list({**merged, **own}.items())

    def text(self, node: yaml.Node, field: str) -> str:
        """A scalar's text exactly as written (quoted scalars unquoted, as YAML does)."""
        if isinstance(node, yaml.ScalarNode):
            if node.tag == _NULL and node.style is None:
                raise SpecError(
                    f"{self.where(node, field)} has no value ({node.value or 'empty'}); "
                    f'write {field.rsplit(".", 1)[-1]}: "" for an empty string'
                )
            return str(node.value)
        shape = "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"
        raise SpecError(f"{self.where(node, field)} must be a single value, not {shape}")

    def integer(self, node: yaml.Node, field: str) -> int:
        if (isinstance(node, yaml.ScalarNode) and node.style is None and _DECIMAL.match(node.value)):
            return int(node.value)
        if isinstance(node, yaml.ScalarNode) and node.style is None and re.match(r"^-?0[0-9]+$", node.value):
            raise SpecError(
                f"{self.where(node, field)} must be an integer: {node.value} has a leading zero, which YAML 1.1 "
                f"reads as octal ({int(node.value, 8)}); write it without the zero"
            )
        written = node.value if isinstance(node, yaml.ScalarNode) else "a list or mapping"
        quoted = " (quoted: write it without quotes)" if isinstance(node, yaml.ScalarNode) and node.style else ""
        raise SpecError(f"{self.where(node, field)} must be an integer, got {written!r}{quoted}")

    def str_list(self, node: yaml.Node, field: str) -> list[str]:
        if isinstance(node, yaml.ScalarNode) and not (node.tag == _NULL and node.style is None):
            try:
                return shlex.split(node.value)
            except ValueError as exc:
                raise SpecError(f"{self.where(node, field)} cannot be split like a shell line: {exc}") from None
        if isinstance(node, yaml.SequenceNode):
            return [self.text(item, f"{field}[{i}]") for i, item in enumerate(node.value)]
        raise SpecError(f"{self.where(node, field)} must be a list of strings or one string")

    def str_map(self, node: yaml.Node, field: str) -> dict[str, str]:
        return {key: self.text(value, f"{field}.{key}") for key, value in self.mapping(node, field)}


def load_spec_file(path: Path) -> dict[str, Any]:
    """Read a spec file into JobSpec keyword arguments; unknown keys are an error naming them.

    Values reach the TrainJob exactly as written: text fields keep their text (``1.10`` stays "1.10",
    ``true`` stays "true", a key ``on`` stays "on"); integers must be written as plain decimal integers.
    A top-level key with no value counts as not given.
    """
    try:
        text = path.read_text() if str(path) != "-" else sys.stdin.read()
    except OSError as exc:
        raise SpecError(f"cannot read spec file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise SpecError(f"spec file {path} is not UTF-8 text: {exc.reason} at byte {exc.start}") from exc
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
    except yaml.YAMLError as exc:
        raise SpecError(f"spec file {path} is not valid YAML: {yaml_problem(exc)}") from exc
    finally:
        loader.dispose()
    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == _NULL):
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise SpecError(f"spec file {path} must be a mapping of keys to values (see `dispatch open --help`)")
    doc = _File(path)
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
            out[field] = doc.str_list(node, key)
        elif field in _MAPS:
            out[field] = doc.str_map(node, key)
        elif field in _INT_FIELDS:
            out[field] = doc.integer(node, key)
        else:
            out[field] = doc.text(node, key)
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
        merged[key] = value
    missing = [flag for flag, key in (("--job-id", "job_id"), ("--submission", "submission")) if not merged.get(key)]
    if missing:
        raise SpecError(f"missing {' and '.join(missing)} (give them as flags or in the spec file)")
    return JobSpec(**merged)
