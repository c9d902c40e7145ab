"""The controller as users deploy it: deploy/ applied to the real API server, the image run as the
Deployment's pod (its ServiceAccount's TokenRequest token, the cluster CA and the in-cluster environment at
the in-cluster paths, non-root, read-only root filesystem, no capabilities), under the shipped roles only.

The Kueue scenarios that also run from the image are parametrised in ``test_testbed.py``
(``launch``/``started``); here: the install itself, the AdmissionCheck turning Active through the
container, its probes, and its secure /metrics reviewed by the real API server.
"""

from __future__ import annotations

# ruff: noqa: ASYNC221  (test harness: podman inspect, off the hot path)
import asyncio
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from dispatch import LABEL_ADMISSION, AsyncAdapter, JobSpec
from dispatch import _kube as k
from dispatch._api import Obj
from dispatch.controller import ACTIVE_MESSAGE
from dispatch.testbed.harness import (
    as_role,
    container_controller,
    controller_env,
    free_port,
    is_running,
    pods_of,
    running_pods,
    running_testbed_kubeconfig,
    until,
)

pytestmark = [pytest.mark.testbed, pytest.mark.packaging]

SERVICE_ACCOUNTS = k.Res("", "v1", "serviceaccounts", "ServiceAccount")
CLUSTER_BINDINGS = k.Res("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
                         namespaced=False)


@pytest.fixture
async def admin(shipped: str) -> AsyncIterator[k.Kube]:
    path = running_testbed_kubeconfig()
    assert path is not None
    kube = k.Kube.connect(namespace="default", kubeconfig=path)
    yield kube
    await kube.aclose()


def test_the_api_servers_certificate_covers_the_address_the_container_uses(testbed_kubeconfig: str) -> None:
    from dispatch.testbed import _container

    assert _container.certificate_covers(_container.API_HOST)
    assert not _container.certificate_covers(_container.API_HOST, server_name="dispatch.example.invalid")


def test_kubectl_apply_k_deploy_is_server_side_and_idempotent(shipped: str) -> None:
    from dispatch.testbed import _container

    for kind in ("namespace/dispatch-system", "serviceaccount/dispatch-controller",
                 "clusterrole.rbac.authorization.k8s.io/dispatch-controller",
                 "clusterrole.rbac.authorization.k8s.io/dispatch-metrics-reader",
                 "deployment.apps/dispatch-controller", "admissioncheck.kueue.x-k8s.io/dispatch"):
        assert f"{kind} serverside-applied" in shipped, shipped
    again = _container.apply_deploy()                       # applying twice changes nothing and fails nothing
    assert again.count("serverside-applied") == shipped.count("serverside-applied")


async def _set_inactive(kube: k.Kube) -> None:
    await kube.apply(k.ADMISSION_CHECKS, "dispatch", {
        "apiVersion": k.ADMISSION_CHECKS.api_version, "kind": "AdmissionCheck", "metadata": {"name": "dispatch"},
        "status": {"conditions": [{"type": "Active", "status": "False", "reason": "Test", "message": "reset",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
        sub="status", field_manager="dispatch-test", force=True)


def _active(check: Obj) -> Obj:
    return next((c for c in (check.get("status") or {}).get("conditions") or [] if c["type"] == "Active"), {})


async def test_the_image_as_deployed_turns_the_check_active_and_serves_secure_metrics(
    admin: k.Kube, tmp_path: Path
) -> None:
    from dispatch.testbed import _container

    await _set_inactive(admin)
    assert _active(await admin.get(k.ADMISSION_CHECKS, "dispatch"))["status"] == "False"
    probes, metrics, guard = free_port(), free_port(), free_port()
    # The Deployment's own arguments (leader election in dispatch-system, probes, secure metrics, the guard
    # with its certificates in the emptyDir), on free host ports: the container shares the host's network.
    args = [a.replace("--metrics-port=8081", f"--metrics-port={probes}")
            .replace("--metrics-bind-address=:8443", f"--metrics-bind-address=:{metrics}")
            .replace("--guard-port=9443", f"--guard-port={guard}")
            for a in _container.deployment_args()]
    assert args != _container.deployment_args() and "--metrics-secure" in args and "--leader-elect" in args
    assert f"--guard-port={guard}" in args and "--guard-cert-dir=/var/run/dispatch-guard" in args
    log = tmp_path / "controller.log"
    ctr = _container.run(args, log=log)
    suffix = uuid.uuid4().hex[:6]
    ns = f"scrape-{suffix}"
    binding = f"scrape-{suffix}"
    try:
        ready = await asyncio.to_thread(_container.wait_ready, probes, 90.0, ctr)

        async def active() -> bool:
            cond = _active(await admin.get(k.ADMISSION_CHECKS, "dispatch"))
            return cond.get("status") == "True" and cond.get("message") == ACTIVE_MESSAGE
        await until(active, timeout=90, what="AdmissionCheck dispatch Active through the container")
        lease = await admin.get(k.LEASES, "dispatch-admission-controller", namespace="dispatch-system")
        assert lease["spec"]["holderIdentity"] == ctr.name           # POD_NAME, as the Deployment sets it
        assert ready.strip()

        inspect = json.loads(subprocess.run([*_container.PODMAN, "inspect", ctr.name], check=True,
                                            capture_output=True, text=True).stdout)[0]
        assert inspect["Config"]["User"] == "65532:65532" and inspect["HostConfig"]["ReadonlyRootfs"] is True
        assert inspect["HostConfig"]["CapDrop"] and not inspect["HostConfig"].get("CapAdd")
        assert inspect["Config"]["Labels"]["org.opencontainers.image.version"]

        # secure /metrics: reviewed by the real API server (TokenReview, SubjectAccessReview)
        await admin.create(k.NAMESPACES, {"metadata": {"name": ns}})
        for sa in ("scraper", "nobody"):
            await admin.create(SERVICE_ACCOUNTS, {"metadata": {"name": sa}}, namespace=ns)
        await admin.create(CLUSTER_BINDINGS, {"metadata": {"name": binding}, "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "dispatch-metrics-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": ns}]})
        scraper = await asyncio.to_thread(_container.token, ns, "scraper", 600)
        nobody = await asyncio.to_thread(_container.token, ns, "nobody", 600)
        async with httpx2.AsyncClient(base_url=f"https://127.0.0.1:{metrics}", verify=False, timeout=15) as https:
            assert (await https.get("/metrics")).status_code == 401
            assert (await https.get("/metrics", headers={"Authorization": "Bearer not-a-token"})).status_code == 401
            denied = await https.get("/metrics", headers={"Authorization": f"Bearer {nobody}"})
            assert denied.status_code == 403 and f"system:serviceaccount:{ns}:nobody" in denied.text

            async def scraped() -> bool:   # RBAC caches on the API server settle within a moment
                got = await https.get("/metrics", headers={"Authorization": f"Bearer {scraper}"})
                return got.status_code == 200 and "dispatch_leader 1.0" in got.text
            await until(scraped, timeout=30, what="an authorized scrape")
        # the guard, served from the image with a certificate it made in the emptyDir: a review of a TrainJob
        # without dispatch's labels is allowed (nothing of dispatch's starts); a GET is refused
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u-1", "operation": "CREATE", "namespace": "default",
            "object": {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                       "metadata": {"name": "plain", "namespace": "default"}, "spec": {}}}}
        async with httpx2.AsyncClient(base_url=f"https://127.0.0.1:{guard}", verify=False, timeout=15) as https:
            answer = (await https.post("/validate-trainjob", json=review)).json()
            assert answer["response"] == {"uid": "u-1", "allowed": True}
            assert (await https.get("/validate-trainjob")).status_code == 405
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{probes}", timeout=15) as plain:
            assert (await plain.get("/metrics")).status_code == 404       # not on the plain probe port
            assert (await plain.get("/healthz")).status_code == 200
    finally:
        code = await asyncio.to_thread(ctr.stop)
        for res, name in ((CLUSTER_BINDINGS, binding), (k.NAMESPACES, ns)):
            try:
                await admin.delete(res, name)
            except Exception:
                pass
    text = log.read_text()
    assert code == 0, text[-3000:]                                    # SIGTERM: a clean stop
    assert "forbidden" not in text.lower(), text[-3000:]
    assert '"controller stopped"' in text


TOKEN_REVIEWS = k.Res("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False)


async def test_a_rotated_token_is_read_again_once_the_old_one_is_revoked(admin: k.Kube, tmp_path: Path) -> None:
    """The kubelet replaces a pod's projected token before it expires; the controller must take the new
    one. Here the old one is also revoked (its bound Secret deleted), so any request still sending it
    gets 401: the controller re-reads the file and goes on admitting."""
    from dispatch.testbed import _container

    path = running_testbed_kubeconfig()
    assert path is not None
    log = tmp_path / "controller.log"
    async with controller_env(path) as (kube, ns, _), container_controller(ns, log=log) as launched, \
            as_role(kube, ns) as writer:
        adapter = AsyncAdapter(writer)
        await adapter.open(JobSpec(job_id="rot", submission="s1", queue="lq"))
        await until(lambda: is_running(kube, "rot-s1"), timeout=90, what="admitted with the first token")
        old = await asyncio.to_thread(_container.rotate_token, launched.container)

        async def revoked() -> bool:
            review = await admin.create(TOKEN_REVIEWS, {"apiVersion": "authentication.k8s.io/v1",
                                                        "kind": "TokenReview", "spec": {"token": old}})
            return not (review.get("status") or {}).get("authenticated")
        await until(revoked, timeout=30, what="the old token revoked")
        await adapter.open(JobSpec(job_id="rot", submission="s2", queue="lq"))
        await until(lambda: is_running(kube, "rot-s2"), timeout=90, what="admitted after the rotation")
        pods = running_pods(await pods_of(kube, "rot-s2"))
        assert [p["metadata"]["labels"][LABEL_ADMISSION] for p in pods] == ["1"]
    text = log.read_text()
    assert "controller failed" not in text, text[-3000:]
