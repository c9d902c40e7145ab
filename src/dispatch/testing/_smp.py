"""Kubernetes' strategic merge patch, as Trainer applies a runtime patch entry to a replicatedJob's Job template.

Trainer v2.2 (``mergeRuntimePatches``) merges each entry's ``replicatedJobs[].template`` into the runtime's
Job template with apimachinery's ``strategicpatch.StrategicMergePatch`` over ``batchv1.JobTemplateSpec``, entry
after entry; v2.3 merges the entry's whole JobSet spec over ``jobsetv1alpha2.JobSetSpec``, whose replicatedJobs
merge by name, so each template meets the same merge (the fake builds as v2.2 does). This is that
algorithm (``mergeMap`` and ``mergeSlice`` of ``k8s.io/apimachinery/pkg/util/strategicpatch``), ported for
the fields of a Job template the fake models: maps merge key by key and recursively, a null value deletes its
key, ``$patch: replace`` / ``delete`` on a map, ``$retainKeys``, ``$deleteFromPrimitiveList/<list>``,
``$setElementOrder/<list>``, lists merged by their patch merge key (containers, env, volumes, ...) with
``$patch: delete`` and ``replace`` elements, primitive lists with the merge strategy (finalizers) unioned, and
every other list and every primitive replaced. ``tests/contract/data/strategic-merge.json`` holds what the real
apimachinery made of each case, and ``tests/contract/test_strategic_merge.py`` holds this port to it.

What a real Trainer never sees is left to ``trainer_patch``: the TrainJob CRD's structural schema prunes
unknown fields at the API server, and Trainer decodes each entry into its typed ``JobTemplatePatch`` before
merging, so a directive survives only as a key of a string map (of those the fake models: labels, annotations,
nodeSelector; the CRD keeps one in a volume's or an affinity's string maps too, where it touches no identity).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

DIRECTIVE = "$patch"
RETAIN_KEYS = "$retainKeys"
DELETE_FROM_PRIMITIVE_LIST = "$deleteFromPrimitiveList"
SET_ELEMENT_ORDER = "$setElementOrder"

Path = tuple[str, ...]
"""A field's place below the Job template: names, with ``[]`` for a list's elements."""

_POD = ("spec", "template", "spec")
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
MERGE_KEYS: dict[Path, str] = {
    ("metadata", "finalizers"): "",
    ("spec", "template", "metadata", "finalizers"): "",
    (*_POD, "volumes"): "name",
    (*_POD, "imagePullSecrets"): "name",
    (*_POD, "schedulingGates"): "name",
    (*_POD, "hostAliases"): "ip",
    (*_POD, "topologySpreadConstraints"): "topologyKey",
    (*_POD, "resourceClaims"): "name",
    **{(*_POD, c): "name" for c in _CONTAINER_LISTS},
    **{(*_POD, c, "[]", "env"): "name" for c in _CONTAINER_LISTS},
    **{(*_POD, c, "[]", "volumeMounts"): "mountPath" for c in _CONTAINER_LISTS},
    **{(*_POD, c, "[]", "volumeDevices"): "devicePath" for c in _CONTAINER_LISTS},
    **{(*_POD, c, "[]", "ports"): "containerPort" for c in _CONTAINER_LISTS},
}
"""The lists of a Job template with the ``merge`` patch strategy (``patchStrategy:"merge"`` in the Go API), by
their patch merge key ("" for a list of primitives). Every other list is replaced whole."""

STRING_MAPS = frozenset({"labels", "annotations", "nodeSelector"})
"""Fields of a runtime patch entry that are ``map[string]string`` in Trainer's API: the only places a key
starting with ``$`` survives the CRD's schema and Trainer's typed decode."""


class PatchError(ValueError):
    """The strategic merge failed (Trainer then builds no JobSet from the TrainJob; its reconcile errors)."""


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "map"
    raise PatchError(f"not a JSON value: {value!r}")


def _remove_directives(obj: Any) -> tuple[Any, bool]:
    """``removeDirectives``: a value to take from the patch as it is, without its directives (False: drop it)."""
    if isinstance(obj, dict):
        if DIRECTIVE in obj:
            return None, False
        for key in list(obj):
            value, keep = _remove_directives(obj[key])
            if keep:
                obj[key] = value
            else:
                del obj[key]
        return obj, True
    if isinstance(obj, list):
        out = []
        for item in obj:
            value, keep = _remove_directives(item)
            if keep:
                out.append(value)
        return out, True
    return obj, True


def _discard_nulls(obj: Any) -> None:
    if isinstance(obj, dict):
        for key in list(obj):
            if obj[key] is None:
                del obj[key]
            else:
                _discard_nulls(obj[key])
    elif isinstance(obj, list):
        for item in obj:
            _discard_nulls(item)


def _value(item: Any, key: str) -> Any:
    return item.get(key) if key and isinstance(item, dict) else item


def _index(items: list[Any], item: Any, key: str) -> int:
    want = _value(item, key)
    return next((i for i, x in enumerate(items) if _value(x, key) == want), -1)


def _stable_sort(items: list[Any], less: Callable[[Any, Any], bool]) -> list[Any]:
    """Go's ``sort.SliceStable`` on a short list (an insertion sort), with its ``less`` as the Go code gives it
    (not a strict order, so Python's sort would not give the same answer)."""
    out = list(items)
    for i in range(1, len(out)):
        j = i
        while j > 0 and less(out[j], out[j - 1]):
            out[j], out[j - 1] = out[j - 1], out[j]
            j -= 1
    return out


def _normalize_slice_order(to_sort: list[Any], order: list[Any], key: str, maps: bool) -> list[Any]:
    deletes: list[Any] = []
    if maps:
        for item in [*to_sort, *order]:
            if not isinstance(item, dict) or key not in item:
                raise PatchError(f"map: {item} does not contain declared merge key: {key}")
        deletes = [x for x in to_sort if x.get(DIRECTIVE) == "delete"]
        to_sort = [x for x in to_sort if x.get(DIRECTIVE) != "delete"]

    def less(a: Any, b: Any) -> bool:
        ia = _index(order, a, key)
        if ia >= 0:
            ib = _index(order, b, key)
            if ib >= 0:
                return ia < ib
        return True
    return [*_stable_sort(to_sort, less), *deletes]


def _merge_sorted(left: list[Any], right: list[Any], server: list[Any], key: str) -> list[Any]:
    out: list[Any] = []
    i = j = 0
    while i < len(left) or j < len(right):
        if i >= len(left):
            out.append(right[j])
            j += 1
        elif j >= len(right):
            out.append(left[i])
            i += 1
        else:
            li, ri = _index(server, left[i], key), _index(server, right[j], key)
            if li >= 0 and ri >= 0 and li < ri:
                out.append(left[i])
                i += 1
            else:
                out.append(right[j])
                j += 1
    return out


def _normalize_element_order(patch: list[Any], server_only: list[Any], patch_order: list[Any],
                             server_order: list[Any], key: str, maps: bool) -> list[Any]:
    patch = _normalize_slice_order(patch, patch_order, key, maps)
    server_only = _normalize_slice_order(server_only, server_order, key, maps)
    return _merge_sorted(server_only, patch, server_order, key)


def _partition(merged: list[Any], by: list[Any], key: str) -> tuple[list[Any], list[Any]]:
    inside = [x for x in merged if _index(by, x, key) >= 0]
    outside = [x for x in merged if _index(by, x, key) < 0]
    return inside, outside


def _dedupe(items: list[Any]) -> list[Any]:
    """Go's ``deduplicateScalars`` (a duplicate is overwritten by the last element, so the order changes)."""
    s = list(items)
    length = len(s) - 1
    i = 0
    while i < length:
        j = i + 1
        while j <= length:
            if s[i] == s[j]:
                s[j] = s[length]
                s = s[:length]
                length -= 1
                j -= 1
            j += 1
        i += 1
    return s


def _element_kind(*lists: list[Any]) -> str:
    kinds = {_kind(x) for items in lists for x in items}
    if not kinds:
        raise PatchError("no elements in any of the given slices")
    if "list" in kinds:
        raise PatchError("lists of lists are not supported")
    if len(kinds) > 1:
        raise PatchError("list element types are not identical")
    return kinds.pop()


def _merge_slice(original: list[Any], patch: list[Any], path: Path, key: str, delete_list: bool) -> list[Any]:
    if not original and not patch:
        return original
    kind = _element_kind(original, patch)
    if kind != "map":
        if delete_list:
            return [x for x in original if x not in patch]
        merged = _dedupe([*original, *patch])
    else:
        if not key:
            raise PatchError(f"cannot merge lists without merge key for {'.'.join(path)}")
        rest: list[Any] = []
        replace = False
        for item in patch:
            directive = item.get(DIRECTIVE) if DIRECTIVE in item else None
            if DIRECTIVE not in item:
                rest.append(item)
            elif directive == "delete":
                if key not in item:
                    raise PatchError(f"map: {item} does not contain declared merge key: {key}")
                original = [x for x in original if not (isinstance(x, dict) and x.get(key) == item[key])]
            elif directive == "replace":
                replace = True
            elif directive == "merge":
                raise PatchError("merging lists cannot yet be specified in the patch")
            else:
                raise PatchError(f"unknown patch type: {directive}")
        if replace:
            original, patch = rest, []
        else:
            patch = rest
        merged = list(original)  # the server's order stays the original's (Go appends to a copy)
        for item in patch:
            if key not in item:
                raise PatchError(f"map: {item} does not contain declared merge key: {key}")
            at = _index(merged, item, key)
            if at >= 0 and isinstance(merged[at], dict):
                merged[at] = _merge_map(merged[at], item, (*path, "[]"))
            else:
                merged.append(item)
    inside, outside = _partition(merged, patch, key)
    return _normalize_element_order(inside, outside, patch, original, key, kind == "map")


def _retain_keys(original: dict[str, Any], patch: dict[str, Any]) -> None:
    if RETAIN_KEYS not in patch:
        return
    keep = patch.pop(RETAIN_KEYS)
    if not isinstance(keep, list):
        raise PatchError("invalid patch format of retainKeys")
    for key, value in patch.items():
        if value is None or key.startswith(DELETE_FROM_PRIMITIVE_LIST) or key.startswith(SET_ELEMENT_ORDER):
            continue
        if key not in keep:
            raise PatchError("invalid patch format of retainKeys")
    for key in list(original):
        if key not in keep:
            del original[key]


def _set_element_order(original: dict[str, Any], patch: dict[str, Any], path: Path) -> None:
    for directive in [k for k in patch if k.startswith(SET_ELEMENT_ORDER)]:
        order = patch.pop(directive)
        if not isinstance(order, list):
            raise PatchError(f"expected a []interface {{}}, but received a {type(order).__name__}")
        prefix, _, field = directive.partition("/")
        if prefix != SET_ELEMENT_ORDER or not field:
            raise PatchError("invalid patch format of setElementOrder list")
        key = MERGE_KEYS.get((*path, field))
        found_o, found_p = field in original, field in patch
        if not found_o and not found_p:
            continue
        if found_o and not found_p:
            merged = original[field]
        elif found_p and not found_o:
            merged, _ = _remove_directives(patch[field])
        else:
            merged = _merge_slice(original[field], patch[field], (*path, field), key or "", False) \
                if key is not None else patch[field]
        items = merged if isinstance(merged, list) else []
        inside, outside = _partition(items, order, key or "")
        original_list = original.get(field) if isinstance(original.get(field), list) else []
        kind = _element_kind(original_list or [], patch.get(field) or [])
        original[field] = _normalize_element_order(inside, outside, order, original_list or [], key or "",
                                                   kind == "map")
        patch.pop(field, None)


def _merge_map(original: dict[str, Any] | None, patch: dict[str, Any], path: Path = ()) -> dict[str, Any]:
    """``mergeMap``: ``patch`` merged into ``original`` (both changed; callers pass copies)."""
    if DIRECTIVE in patch:
        directive = patch[DIRECTIVE]
        if directive == "replace":
            del patch[DIRECTIVE]
            return patch
        if directive == "delete":
            return {}
        raise PatchError(f"unknown patch type: {directive} in map: {patch}")
    out = original if original is not None else {}
    _retain_keys(out, patch)
    _set_element_order(out, patch, path)
    for key, value in list(patch.items()):
        delete_list = False
        if key.startswith(DELETE_FROM_PRIMITIVE_LIST):
            prefix, _, field = key.partition("/")
            if prefix != DELETE_FROM_PRIMITIVE_LIST or not field:
                raise PatchError("invalid patch format of deleteFromPrimitiveList list")
            key, delete_list = field, True
        if value is None:
            out.pop(key, None)
            continue
        if key not in out:
            if not delete_list:
                _discard_nulls(value)
                kept, keep = _remove_directives(value)
                if keep:
                    out[key] = kept
            continue
        if _kind(out[key]) != _kind(value):
            if not delete_list:
                _discard_nulls(value)
                kept, keep = _remove_directives(value)
                if keep:
                    out[key] = kept
                else:
                    del out[key]
            continue
        where = (*path, key)
        if isinstance(value, dict):
            out[key] = _merge_map(out[key], value, where)
        elif isinstance(value, list):
            merge_key = MERGE_KEYS.get(where)
            out[key] = _merge_slice(out[key], value, where, merge_key or "", delete_list) \
                if merge_key is not None or delete_list else value
        else:
            kept, keep = _remove_directives(value)
            if keep:
                out[key] = kept
            else:
                del out[key]
    return out


def strategic_merge(source: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``patch`` applied to ``source`` (a Job template) as ``StrategicMergePatch(source, patch,
    batchv1.JobTemplateSpec{})`` applies it; neither argument is changed. Raises ``PatchError`` where the real
    merge returns an error."""
    return _merge_map(copy.deepcopy(source), copy.deepcopy(patch))


def trainer_patch(template: Any, string_map: bool = False) -> Any:
    """A runtime patch entry's Job template patch as Trainer merges it: keys starting with ``$`` dropped
    except as keys of a string map (the CRD's structural schema prunes them at the API server, and Trainer's
    typed decode would drop them too), nulls dropped (a string map's value cannot be null)."""
    if isinstance(template, dict):
        out = {}
        for key, value in template.items():
            if value is None or (key.startswith("$") and not string_map):
                continue
            out[key] = trainer_patch(value, key in STRING_MAPS)
        return out
    if isinstance(template, list):
        return [trainer_patch(item) for item in template]
    return template
