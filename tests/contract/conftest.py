"""Contract tests run unchanged against the fake API server and the real kube-apiserver of the testbed."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from dispatch import _kube as k
from dispatch.testing import FakeApiServer


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.testbed)])
async def api(request: pytest.FixtureRequest) -> AsyncIterator[k.Kube]:
    """A ``Kube`` on a fresh namespace, of the fake or of the real API server."""
    namespace = f"contract-{uuid.uuid4().hex[:8]}"
    if request.param == "fake":
        server = FakeApiServer()
        kube = k.Kube.connect(namespace=namespace, transport=server.transport())
    else:
        kubeconfig = request.getfixturevalue("testbed_kubeconfig")
        kube = k.Kube.connect(namespace=namespace, kubeconfig=kubeconfig)
    await kube.create(k.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    try:
        yield kube
    finally:
        if request.param == "real":
            try:
                await kube.delete(k.NAMESPACES, namespace)
            except Exception:
                pass
        await kube.aclose()
