"""The URL ``Kube`` builds for a request is the one httpx2 built from the same path and params."""

from __future__ import annotations

import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch import _kube as k

PATHS = ["/api/v1/namespaces/default/pods", "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns-1/workloads/w.a-1/status",
         "/api/v1/nodes/node-0", "/version", "/api/v1/namespaces/default/pods?watch=true"]
BASES = ["https://fake.invalid", "https://10.0.0.1:6443/", "https://proxy.invalid/k8s/clusters/c-1",
         "https://proxy.invalid/k8s/clusters/c-1/"]
CLIENTS = {base: httpx2.AsyncClient(base_url=base) for base in BASES}
"""One client a base URL (building one is slow, and none of them ever connects)."""
VALUES = st.text(alphabet=st.sampled_from("az09-./_=!,() %&?+~éß"), max_size=30)


@pytest.mark.parametrize("base", BASES)
@settings(max_examples=50)
@given(path=st.sampled_from(PATHS), params=st.dictionaries(st.sampled_from(
    ["labelSelector", "fieldSelector", "limit", "continue", "resourceVersion", "fieldManager", "force"]), VALUES))
def test_the_url_is_httpx2s(base: str, path: str, params: dict[str, str]) -> None:
    client = CLIENTS[base]
    want = client.build_request("GET", path, params=params or None).url
    got = k.Kube(client, "default")._url(path, params or None)
    assert got == want
    assert dict(got.params) == dict(want.params)
