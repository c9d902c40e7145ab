"""``dispatch open``'s input: a small YAML spec file, flags on top of it, into a ``JobSpec``."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

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


def _str_list(key: str, value: Any) -> list[str]:
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, Sequence) and all(isinstance(v, str | int | float) for v in value):
        return [str(v) for v in value]
    raise SpecError(f"{key} must be a list of strings or one string")


def _str_map(key: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise SpecError(f"{key} must be a mapping of names to values")
    return {str(k): str(v) for k, v in value.items()}


def load_spec_file(path: Path) -> dict[str, Any]:
    """Read a spec file into JobSpec keyword arguments; unknown keys are an error naming them."""
    try:
        text = path.read_text() if str(path) != "-" else sys.stdin.read()
    except OSError as exc:
        raise SpecError(f"cannot read spec file {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"spec file {path} is not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise SpecError(f"spec file {path} must be a mapping (see `dispatch open --help`)")
    out: dict[str, Any] = {}
    unknown: list[str] = []
    for raw_key, value in data.items():
        key = str(raw_key)
        field = SPEC_KEYS.get(key) or (key if key in _FIELDS else None)
        if field is None:
            unknown.append(key)
            continue
        if value is None:
            continue
        if field in ("command", "args"):
            out[field] = _str_list(key, value)
        elif field in _MAPS:
            out[field] = _str_map(key, value)
        elif field in ("num_nodes", "termination_grace_period_seconds"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecError(f"{key} must be an integer")
            out[field] = value
        else:
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                raise SpecError(f"{key} must be a string")
            out[field] = str(value)
    if unknown:
        known = ", ".join(SPEC_KEYS)
        raise SpecError(f"unknown key(s) in {path}: {', '.join(unknown)} (known: {known})")
    return out


def parse_pairs(option: str, values: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` items (each may hold several, comma-separated) into a dict."""
    out: dict[str, str] = {}
    for item in values:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise SpecError(f"{option} expects KEY=VALUE, got {part!r}")
            out[key.strip()] = value.strip()
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
