"""A node drain on the real control plane: the shipped PodDisruptionBudget and spread keep one guard replica.

deploy/'s Deployment (two replicas, its topology spread, priority class and security context as shipped)
and its PodDisruptionBudget go into the test's namespace, on two fresh KWOK nodes of their own (tainted,
so nothing else lands there; the test adds only the toleration and node selector that keep the replicas
on them). The real scheduler must put one replica on each node. Each replica is paired with a real guard,
``python -m dispatch.controller --guard-port`` on this host, with only the controller's ServiceAccount
token and the shipped roles. The testbed has no Service proxy, so the test's TCP forwarder plays it: it
sends each connection of the API server's webhook call to a replica whose endpoint the real EndpointSlice
controller lists as ready, as kube-proxy would.

The drain is `kubectl drain`'s: both nodes are cordoned (a pool being drained), then the Eviction API is
called for each replica. The first eviction is allowed; the evicted replica's guard stops once its endpoint
leaves; the second eviction is refused by the PodDisruptionBudget (its replacement cannot be scheduled, so
it is not ready); and every start tried meanwhile is answered by the remaining guard, never refused for
want of one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch import _api as api
from dispatch import _kube as k
from dispatch import testbed as tb
from dispatch.controller import _tls as g_
from dispatch.testbed.harness import free_port, probe_denied, scoped, subprocess_controller, until

from . import test_testbed as tt
from .test_testbed import DEPLOY, kubeconfig
from .test_testbed import _kubectl as kubectl_path

env, rbac = tt.env, tt.rbac   # the fixtures: a fresh namespace with the shipped roles bound to ServiceAccounts

pytestmark = pytest.mark.testbed

Obj = dict[str, Any]
SLICES = k.Res("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", status=False)
SELECTOR = "app.kubernetes.io/name=dispatch,app.kubernetes.io/component=admission-controller"
REFUSED = "Cannot evict pod as it would violate the pod's disruption budget"


def shipped() -> tuple[Obj, Obj, Obj]:
    """deploy/'s Deployment, PodDisruptionBudget and guard Service."""
    docs = [d for d in yaml.safe_load_all((DEPLOY / "base" / "deployment.yaml").read_text()) if d]
    guard = [d for d in yaml.safe_load_all((DEPLOY / "base" / "guard.yaml").read_text()) if d]
    [dep] = [d for d in docs if d["kind"] == "Deployment"]
    [pdb] = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    [svc] = [d for d in guard if d["kind"] == "Service"]
    return dep, pdb, svc


def kwok_node(name: str, key: str, value: str, cidr: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name,
                         "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok",
                                    key: value}},
            "spec": {"taints": [{"key": key, "value": value, "effect": "NoSchedule"}], "podCIDR": cidr,
                     "podCIDRs": [cidr]},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                       "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"}}}


class Forwarder:
    """A Service's proxy for the webhook: each connection goes to a replica whose endpoint is ready."""

    def __init__(self, kube: k.Kube, backends: dict[str, int]) -> None:
        self.kube, self.backends = kube, backends
        self.ready: list[str] = []
        self.sent: dict[str, int] = dict.fromkeys(backends, 0)

    async def follow(self) -> None:
        while True:
            slices = (await self.kube.list(SLICES, labels="kubernetes.io/service-name=dispatch-guard")).items
            self.ready = sorted(e["targetRef"]["name"] for s in slices for e in s.get("endpoints") or []
                                if (e.get("conditions") or {}).get("ready") and e.get("targetRef", {}).get("name")
                                in self.backends)
            await asyncio.sleep(0.1)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.ready:
            writer.close()
            return
        pod = self.ready[sum(self.sent.values()) % len(self.ready)]
        self.sent[pod] += 1
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.backends[pod])
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()
        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))


def evict(ns: str, pod: str) -> subprocess.CompletedProcess[str]:
    body = json.dumps({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": ns}})
    return tb.kubectl("create", "--raw", f"/api/v1/namespaces/{ns}/pods/{pod}/eviction", "-f", "-",
                      input=body, check=False)


async def replicas(kube: k.Kube) -> list[Obj]:
    return [p for p in (await kube.list(k.PODS, labels=SELECTOR)).items
            if not p["metadata"].get("deletionTimestamp")]


def sa_kubeconfig(ns: str, path: Path) -> Path:
    token = subprocess.run([kubectl_path(), "--kubeconfig", str(kubeconfig()), "-n", ns, "create", "token",
                            "controller"], check=True, capture_output=True, text=True).stdout.strip()
    admin = yaml.safe_load(kubeconfig().read_text())
    cluster = admin["clusters"][0]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": "sa", "namespace": ns}}],
        "current-context": "sa"}))
    return path


@contextlib.asynccontextmanager
async def pool(kube: k.Kube, ns: str) -> AsyncIterator[list[str]]:
    """Two fresh KWOK nodes of the test's own, removed afterwards."""
    sfx = ns.split("-", 1)[1]
    key = "dispatch.test/drain"
    names = [f"drain-{sfx}-{c}" for c in "ab"]
    for i, name in enumerate(names):
        await kube.create(k.NODES, kwok_node(name, key, sfx, f"10.250.{i}.0/24"))
    try:
        yield names
    finally:
        for name in names:
            with contextlib.suppress(Exception):
                await kube.delete(k.NODES, name)


async def test_a_drain_evicts_one_replica_and_starts_are_still_answered(
        rbac: tuple[k.Kube, str], tmp_path: Path) -> None:
    kube, ns = rbac
    dep, pdb, svc = shipped()
    async with pool(kube, ns) as nodes:
        sfx = ns.split("-", 1)[1]
        spec = dep["spec"]["template"]["spec"]
        spec["nodeSelector"] = {"dispatch.test/drain": sfx}
        spec["tolerations"] = [{"key": "dispatch.test/drain", "operator": "Equal", "value": sfx,
                                "effect": "NoSchedule"}]
        for obj in (dep, pdb, svc):
            obj["metadata"]["namespace"] = ns
        tb.kubectl("-n", ns, "create", "serviceaccount", "dispatch-controller")
        tb.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(o) for o in (dep, pdb, svc)))

        async def two_ready() -> bool:
            pods = await replicas(kube)
            return len(pods) == 2 and all(
                any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))
                for p in pods)
        await until(two_ready, what="two replicas ready")
        placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in await replicas(kube)}
        assert sorted(placed.values()) == nodes, placed          # the spread: one per node
        for p in await replicas(kube):                            # as shipped: critical, no user id
            assert p["spec"]["priorityClassName"] == "system-cluster-critical" and p["spec"]["priority"] > 10**9
            assert "runAsUser" not in p["spec"]["securityContext"]

        ca = g_.generate_certs(tmp_path / "certs", ["localhost", "127.0.0.1"]).ca_pem
        assert ca is not None
        ports = {pod: free_port() for pod in placed}
        fwd = Forwarder(kube, ports)
        server = await asyncio.start_server(fwd.handle, "127.0.0.1", 0)
        follower = asyncio.create_task(fwd.follow())
        hook_name = f"dispatch-guard-{ns}"
        hook, _, _ = scoped(ns, int(server.sockets[0].getsockname()[1]), hook_name)
        for w in hook["webhooks"]:
            w["clientConfig"]["caBundle"] = base64.b64encode(ca).decode()
        sa = sa_kubeconfig(ns, tmp_path / "sa-kubeconfig")
        try:
            async with contextlib.AsyncExitStack() as stack:
                procs = {}
                for pod, port in ports.items():
                    procs[pod] = await stack.enter_async_context(subprocess_controller(
                        ns, "--guard-port", str(port), "--guard-cert-dir", str(tmp_path / "certs"),
                        "--guard-webhook", "", kubeconfig_path=sa, log=tmp_path / f"{pod}.log"))
                await kube.create(api.VALIDATING_WEBHOOKS, hook)
                await until(lambda: probe_denied(kube, ns), what="the guard answering through the Service")
                await until(lambda: len(fwd.ready) == 2, what="both endpoints ready")

                # the drain: cordon the pool, then evict replica by replica
                for node in nodes:
                    tb.kubectl("cordon", node)
                first, second = sorted(placed)
                got = evict(ns, first)
                assert got.returncode == 0, got.stderr
                await until(lambda: first not in fwd.ready, what="the evicted replica's endpoint gone")
                procs[first].proc.terminate()                 # what the kubelet does to the evicted pod
                procs[first].proc.wait(10)

                refused = evict(ns, second)
                print("SECOND EVICTION:", refused.stderr.strip())
                assert refused.returncode != 0 and REFUSED in refused.stderr
                assert procs[first].proc.poll() is not None and fwd.ready == [second]
                for _ in range(10):      # starts tried meanwhile: each answered by the guard left, none failed
                    answers: list[str] = []
                    assert await probe_denied(kube, ns, answers), answers
                assert fwd.sent[second] >= 1
                pending = [p for p in await replicas(kube) if p["metadata"]["name"] not in placed]
                assert [p["status"].get("phase") for p in pending] == ["Pending"]   # nowhere to go: cordoned

                tb.kubectl("uncordon", nodes[0])              # the pool comes back: the replacement lands
                await until(two_ready, what="the replacement ready after uncordon")
        finally:
            follower.cancel()
            server.close()
            with contextlib.suppress(Exception):
                await kube.delete(api.VALIDATING_WEBHOOKS, hook_name)
            for node in nodes:
                tb.kubectl("uncordon", node, check=False)
            tb.kubectl("-n", ns, "delete", "deployment", "dispatch-controller", "--wait=false", check=False)

