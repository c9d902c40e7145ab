"""Size limits, asserted the same way on the fake and on the real API server: a ConfigMap holds at most
1 MiB of data (validation, 422), and no object's write may exceed etcd's request limit (500, from etcd)."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest

from dispatch import Refused, Unreachable
from dispatch import _kube as k

Obj = dict[str, Any]
MiB = 1024 * 1024
TOO_LONG = "Too long: may not be more than 1048576 bytes"


def configmap(name: str, data: dict[str, str] | None = None, binary: dict[str, bytes] | None = None) -> Obj:
    obj: Obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
    if data is not None:
        obj["data"] = data
    if binary is not None:
        obj["binaryData"] = {key: base64.b64encode(value).decode() for key, value in binary.items()}
    return obj


def keys_only(count: int, width: int = 63) -> dict[str, str]:
    """Many keys with one-byte values: validation counts values only, so only etcd's limit stops this."""
    return {f"k{i:0{width - 1}d}": "1" for i in range(count)}


async def test_configmap_data_up_to_one_mebibyte_is_accepted(api: k.Kube) -> None:
    await api.create(k.CONFIGMAPS, configmap("full", {"a": "x" * (MiB - 10), "b": "y" * 10}))
    await api.create(k.CONFIGMAPS, configmap("full-binary", binary={"a": b"\0" * (MiB // 2)},
                                             data={"b": "y" * (MiB // 2)}))


@pytest.mark.parametrize("shape", ["data", "binaryData", "both"])
async def test_configmap_data_over_one_mebibyte_is_invalid(api: k.Kube, shape: str) -> None:
    if shape == "data":
        obj = configmap("over", {"a": "x" * MiB, "b": "y"})
    elif shape == "binaryData":
        obj = configmap("over", binary={"a": b"\1" * (MiB + 1)})
    else:
        obj = configmap("over", {"a": "x" * (MiB // 2)}, binary={"b": b"\1" * (MiB // 2 + 1)})
    with pytest.raises(Refused) as err:
        await api.create(k.CONFIGMAPS, obj)
    assert err.value.code == 422 and err.value.reason == "Invalid"
    assert f'ConfigMap "over" is invalid: []: {TOO_LONG}' in str(err.value)
    assert [(c.field, c.reason, c.message) for c in err.value.causes] == [("[]", "FieldValueTooLong", TOO_LONG)]
    assert await api.get_or_none(k.CONFIGMAPS, "over") is None


async def test_a_patch_past_one_mebibyte_is_invalid_and_changes_nothing(api: k.Kube) -> None:
    await api.create(k.CONFIGMAPS, configmap("grow", {"a": "x" * (MiB - 1)}))
    with pytest.raises(Refused) as err:
        await api.merge_patch(k.CONFIGMAPS, "grow", {"data": {"b": "yy"}})
    assert err.value.code == 422 and TOO_LONG in str(err.value)
    assert sorted((await api.get(k.CONFIGMAPS, "grow"))["data"]) == ["a"]


async def test_an_object_near_the_etcd_limit_is_stored(api: k.Kube) -> None:
    made = await api.create(k.CONFIGMAPS, configmap("near", keys_only(20_000)))  # about 1.4 MB of keys
    assert len(made["data"]) == 20_000


async def test_an_object_over_the_etcd_limit_is_refused_by_etcd(api: k.Kube) -> None:
    with pytest.raises(Unreachable) as err:
        await api.create(k.CONFIGMAPS, configmap("huge", keys_only(23_000)))  # about 1.6 MB of keys
    assert err.value.code == 500
    assert "etcdserver: request is too large" in str(err.value)
    assert await api.get_or_none(k.CONFIGMAPS, "huge") is None


async def test_growing_an_object_past_the_etcd_limit_fails_and_keeps_it_as_it_was(api: k.Kube) -> None:
    await api.create(k.CONFIGMAPS, configmap("ledger", keys_only(20_000)))
    more = {f"x{i:062d}": "1" for i in range(3_000)}
    with pytest.raises(Unreachable) as err:
        await api.merge_patch(k.CONFIGMAPS, "ledger", {"data": more})
    assert err.value.code == 500 and "etcdserver: request is too large" in str(err.value)
    assert len((await api.get(k.CONFIGMAPS, "ledger"))["data"]) == 20_000


async def test_the_etcd_limit_falls_on_the_same_object(api: k.Kube) -> None:
    """The last ConfigMap of 63-character keys that fits, and the first that does not (about 1.5 MiB)."""
    await api.create(k.CONFIGMAPS, configmap("edge", keys_only(22_466)))
    with pytest.raises(Unreachable) as err:
        await api.create(k.CONFIGMAPS, configmap("edgf", keys_only(22_467)))
    assert err.value.code == 500 and "etcdserver: request is too large" in str(err.value)


async def test_past_two_mebibytes_the_api_servers_etcd_client_refuses_to_send(api: k.Kube) -> None:
    with pytest.raises(Unreachable) as err:
        await api.create(k.CONFIGMAPS, configmap("huger", keys_only(36_000)))
    assert err.value.code == 500 and err.value.reason == ""
    assert re.search(r"rpc error: code = ResourceExhausted desc = trying to send message larger than max "
                     r"\(25\d{5} vs\. 2097152\)", str(err.value)), str(err.value)


async def test_a_request_body_over_three_mebibytes_is_too_large(api: k.Kube) -> None:
    with pytest.raises(Refused) as err:
        await api.create(k.CONFIGMAPS, configmap("body", keys_only(47_000)))
    assert err.value.code == 413 and err.value.reason == "RequestEntityTooLarge"
    assert "Request entity too large: limit is 3145728" in str(err.value)


async def test_annotations_over_256_kib_are_invalid(api: k.Kube) -> None:
    fits = configmap("notes", {})
    fits["metadata"]["annotations"] = {"a": "x" * (256 * 1024 - 1)}
    await api.create(k.CONFIGMAPS, fits)
    with pytest.raises(Refused) as err:
        await api.merge_patch(k.CONFIGMAPS, "notes", {"metadata": {"annotations": {"b": "y"}}})
    message = "Too long: may not be more than 262144 bytes"
    assert err.value.code == 422 and f'ConfigMap "notes" is invalid: metadata.annotations: {message}' in str(err.value)
    # the real server repeats this cause on an update (four times on v1.35); the fake gives it once
    assert {(c.field, c.reason, c.message) for c in err.value.causes} == {
        ("metadata.annotations", "FieldValueTooLong", message)}
    assert "b" not in ((await api.get(k.CONFIGMAPS, "notes"))["metadata"].get("annotations") or {})
