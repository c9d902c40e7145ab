"""The guard's HTTPS server on the fake cluster: AdmissionReviews in, the same consistent read, answers out.

The server is reached over real TLS, verified against the CA it generated, with two reviews on one
kept-alive connection (as the API server sends them).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime as dt
import json
import ssl
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry

from dispatch import LABEL_ADMISSION, LABEL_JOB_ID, POD_FINALIZER, AsyncAdapter, JobSpec
from dispatch import _api as api
from dispatch import _kube as k
from dispatch.controller import _guard as g
from dispatch.controller import _tls as tls
from dispatch.testing import FakeCluster

NAME = "llama-s1"
Obj = dict[str, Any]


async def held_with_terminating_pod(adapter: AsyncAdapter, cluster: FakeCluster) -> str:
    await adapter.open(JobSpec(job_id="llama", submission="s1"))
    await adapter.release(NAME)
    cluster.settle()
    pod = str(cluster.pods(NAME)[0]["metadata"]["name"])
    await adapter.hold(NAME)
    cluster.settle()  # the grace period is not over: the pod stays Terminating
    return pod


def review(old: Obj | None, new: Obj, operation: str = "UPDATE") -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "req-1", "operation": operation, "namespace": "default", "name": new["metadata"]["name"],
        "object": new, "oldObject": old, "userInfo": {"username": "someone"}}}).encode()


async def post(port: int, ca: Path, bodies: list[bytes], path: str = g.PATH) -> list[tuple[int, Obj]]:
    """POST each body on one TLS connection verified against ``ca``; (status, JSON) per answer."""
    ctx = ssl.create_default_context(cafile=str(ca))
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
    out = []
    try:
        for body in bodies:
            writer.write(f"POST {path}?timeout=10s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            length = int(next(line.split(":")[1] for line in head.split("\r\n") if line.lower().startswith(
                "content-length")))
            out.append((int(head.split()[1]), json.loads(await reader.readexactly(length))))
    finally:
        writer.close()
    return out


async def test_a_start_is_denied_naming_the_pod_and_other_writes_pass(
        adapter: AsyncAdapter, cluster: FakeCluster, kube: k.Kube, tmp_path: Path) -> None:
    pod = await held_with_terminating_pod(adapter, cluster)
    old = cluster.server.get(api.TRAINJOBS.group, "trainjobs", "default", NAME)
    assert old is not None
    start = copy.deepcopy(old)
    start["spec"]["suspend"] = False
    noted = copy.deepcopy(old)
    noted["metadata"].setdefault("annotations", {})["team"] = "vision"
    foreign = copy.deepcopy(start)
    foreign["metadata"]["labels"] = {}
    foreign_old = copy.deepcopy(old)
    foreign_old["metadata"]["labels"] = {}

    registry = CollectorRegistry()
    running = await g.start(kube, host="127.0.0.1", port=0, cert_dir=str(tmp_path / "certs"),
                            hosts=["localhost", "127.0.0.1"], webhook="", registry=registry)
    try:
        ca = tmp_path / "certs" / "ca.crt"
        answers = await post(running.port, ca, [review(old, start), review(old, noted), review(foreign_old, foreign)])
        answers += await post(running.port, ca, [b"{}"], path="/other")
        answers += await post(running.port, ca, [b"not json"])
        assert running.guard.reviews == 3 and running.guard.denials == 1
        assert registry.get_sample_value("dispatch_guard_reviews_total", {"answer": "denied"}) == 1
        assert registry.get_sample_value("dispatch_guard_reviews_total", {"answer": "allowed"}) == 2
        assert registry.get_sample_value("dispatch_guard_review_seconds_count") == 3
    finally:
        await running.close()
    (s1, denied), (s2, noted_a), (s3, foreign_a), (s4, _), (s5, bad) = answers
    assert (s1, s2, s3, s4, s5) == (200, 200, 200, 404, 400)
    response = denied["response"]
    assert response["uid"] == "req-1" and response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["message"].startswith(f"trainjob {NAME} cannot start: remaining pods: {pod} on node-")
    assert noted_a["response"] == {"uid": "req-1", "allowed": True}
    assert foreign_a["response"]["allowed"] is True
    assert "error" in bad


async def test_a_read_that_does_not_finish_in_time_is_a_denial(
        adapter: AsyncAdapter, cluster: FakeCluster, kube: k.Kube) -> None:
    await held_with_terminating_pod(adapter, cluster)
    old = cluster.server.get(api.TRAINJOBS.group, "trainjobs", "default", NAME)
    assert old is not None
    start = copy.deepcopy(old)
    start["spec"]["suspend"] = False

    answer = (await g.Guard(kube).review(json.loads(review(old, start)), timeout=0.0))["response"]
    assert answer["allowed"] is False
    assert answer["status"]["message"].startswith("the guard could not read the object's pods within")


def test_timeout_is_most_of_what_the_api_server_allows() -> None:
    assert g._timeout_of("/validate-trainjob?timeout=10s") == 8.0
    assert g._timeout_of("/validate-trainjob?timeout=30s") == 24.0
    assert g._timeout_of("/validate-trainjob") == 8.0
    assert g._timeout_of("/validate-trainjob?timeout=bogus") == 8.0


def test_existing_certificates_are_used_as_they_are(tmp_path: Path) -> None:
    first = tls.load_or_generate(tmp_path, ["localhost"])
    again = tls.load_or_generate(tmp_path, ["localhost"])
    assert again == first and first.ca_pem is not None
    (tmp_path / "ca.crt").unlink()  # cert-manager's Secret without ca.crt: someone else publishes the CA
    assert tls.load_or_generate(tmp_path, ["localhost"]).ca_pem is None


def _ca(days_from_now: int, minutes_ago: int = 0) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"ca-{days_from_now}-{minutes_ago}")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=30, minutes=minutes_ago))
            .not_valid_after(now + dt.timedelta(days=days_from_now)).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def test_the_bundle_keeps_every_live_replicas_ca_and_drops_expired_ones() -> None:
    ours, other, expired = _ca(10), _ca(10, minutes_ago=5), _ca(-1)
    bundle = tls.merged_bundle(other + expired, ours)
    assert bundle == ours + other
    assert tls.merged_bundle(bundle, ours) == bundle  # publishing again changes nothing
    many = b"".join(_ca(10, minutes_ago=m) for m in range(12))
    kept = x509.load_pem_x509_certificates(tls.merged_bundle(many, ours, keep=4))
    assert len(kept) == 4 and kept[0] == x509.load_pem_x509_certificate(ours)
    assert tls.merged_bundle(b"garbage", ours) == ours


# ---------------------------------------------------------------- enrolment (/mutate-trainjob)


def sdk_create(name: str, runtime: Obj | None = None, labels: Obj | None = None) -> Obj:
    """A TrainJob as the Kubeflow SDK creates it: no dispatch field at all."""
    return {"apiVersion": api.TRAINJOBS.api_version, "kind": "TrainJob",
            "metadata": {"name": name, "namespace": "default", **({"labels": labels} if labels else {})},
            "spec": {"runtimeRef": runtime or {"name": "torch-distributed", "kind": "ClusterTrainingRuntime"},
                     "trainer": {"image": "example.invalid/train", "numNodes": 1}}}


def create_review(obj: Obj, uid: str) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "operation": "CREATE", "namespace": "default", "name": obj["metadata"]["name"],
        "object": obj, "oldObject": None, "userInfo": {"username": "sdk-user"}}}).encode()


def patched(obj: Obj, answer: Obj) -> Obj:
    """The object with the answer's JSONPatch applied (add ops, as enrolment sends)."""
    out = copy.deepcopy(obj)
    assert answer["patchType"] == "JSONPatch"
    for op in json.loads(base64.b64decode(answer["patch"])):
        assert op["op"] == "add"
        *parents, last = [t.replace("~1", "/") for t in op["path"].split("/")[1:]]
        node: Any = out
        for part in parents:
            node = node[part]
        if last == "-":
            node.append(op["value"])
        else:
            node[last] = op["value"]
    return out


async def test_an_sdk_create_is_enrolled_over_tls_and_then_released_by_dispatch(
        adapter: AsyncAdapter, cluster: FakeCluster, kube: k.Kube, tmp_path: Path) -> None:
    cluster.server.create(api.RUNTIMES.group, "trainingruntimes", "default", {
        "metadata": {"name": "mine", "namespace": "default"},
        "spec": {"template": {"spec": {"replicatedJobs": [{"name": "launcher"}, {"name": "worker"}]}}}})
    sdk = sdk_create("uafe94fe6d9a")
    own = sdk_create("own-runtime", {"name": "mine", "kind": "TrainingRuntime"})
    lost = sdk_create("lost-runtime", {"name": "gone", "kind": "ClusterTrainingRuntime"})
    bad = sdk_create("bad-label", labels={LABEL_JOB_ID: "Not Valid"})
    registry = CollectorRegistry()
    running = await g.start(kube, host="127.0.0.1", port=0, cert_dir=str(tmp_path / "certs"),
                            hosts=["localhost", "127.0.0.1"], webhook="", registry=registry)
    try:
        answers = await post(running.port, tmp_path / "certs" / "ca.crt", [
            create_review(sdk, "8d2f3c1e-0000-4000-8000-00000000000a"), create_review(own, "u-2"),
            create_review(lost, "u-3"), create_review(bad, "u-4")], path=g.MUTATE_PATH)
        assert registry.get_sample_value("dispatch_guard_reviews_total", {"answer": "enrolled"}) == 2
        assert registry.get_sample_value("dispatch_guard_reviews_total", {"answer": "denied"}) == 2
    finally:
        await running.close()
    assert [status for status, _ in answers] == [200] * 4
    (_, one), (_, two), (_, three), (_, four) = answers
    first = one["response"]
    assert first["uid"] == "8d2f3c1e-0000-4000-8000-00000000000a" and first["allowed"] is True
    assert first["warnings"] == ["dispatch enrolled this TrainJob as uafe94fe6d9a/8d2f3c1e-0000-4000-8000-"
                                 "00000000000a, suspended: `dispatch release uafe94fe6d9a` starts it"]
    enrolled = patched(sdk, first)
    # the namespaced runtime was read: its two replicatedJobs are targeted
    entry = patched(own, two["response"])["spec"]["runtimePatches"][0]
    assert [rj["name"] for rj in entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]] == [
        "launcher", "worker"]
    assert three["response"]["allowed"] is False and three["response"]["status"]["message"] == (
        "trainjob lost-runtime cannot be enrolled in dispatch: spec.runtimeRef.name: ClusterTrainingRuntime gone "
        "not found")
    assert "metadata.labels[dispatch.phpboyscout.uk/job-id] 'Not Valid'" in four["response"]["status"]["message"]
    assert "patch" not in four["response"]

    # what the API server stores is an ordinary held dispatch object: dispatch's release admits it
    cluster.server.create(api.TRAINJOBS.group, "trainjobs", "default", enrolled)
    status = await adapter.inspect("uafe94fe6d9a")
    assert status.state.value == "Held" and status.identity is not None
    assert (status.identity.job_id, status.identity.submission) == ("uafe94fe6d9a",
                                                                    "8d2f3c1e-0000-4000-8000-00000000000a")
    ident = await adapter.release("uafe94fe6d9a")
    assert ident.admission == 1
    cluster.settle()
    [pod] = cluster.pods("uafe94fe6d9a")
    assert pod["metadata"]["labels"][LABEL_ADMISSION] == "1"
    assert POD_FINALIZER in pod["metadata"]["finalizers"]


async def test_only_creates_are_enrolled_and_a_slow_runtime_read_is_a_denial(kube: k.Kube) -> None:
    guard = g.Guard(kube)
    update = json.loads(create_review(sdk_create("x"), "u-1"))
    update["request"]["operation"] = "UPDATE"
    assert (await guard.mutate(update, timeout=5))["response"] == {"uid": "u-1", "allowed": True}
    slow = (await guard.mutate(json.loads(create_review(sdk_create("x"), "u-2")), timeout=0.0))["response"]
    assert slow["allowed"] is False
    assert slow["status"]["message"].startswith("the guard could not read the TrainJob's runtime within")


# --------------------------------------------------------------------------- certificates that end


def test_renewal_is_due_ahead_of_the_end(tmp_path: Path) -> None:
    short = tls.generate_certs(tmp_path / "short", ["localhost"], days=10)
    long = tls.generate_certs(tmp_path / "long", ["localhost"], days=365)
    assert tls.renewal_due(short.cert) and not tls.renewal_due(long.cert)
    assert tls.renewal_due(long.cert, before=dt.timedelta(days=400))
    (tmp_path / "garbage.crt").write_text("not a certificate")
    assert tls.renewal_due(tmp_path / "garbage.crt") and tls.renewal_due(tmp_path / "missing.crt")


def test_a_due_certificate_of_our_own_is_replaced_at_start_and_a_mounted_one_is_not(
        tmp_path: Path, monkeypatch: Any) -> None:
    due = tls.generate_certs(tmp_path, ["localhost"], days=10)
    assert tls.load_or_generate(tmp_path, ["localhost"], renew=False) == due   # someone else publishes its CA
    renewed = tls.load_or_generate(tmp_path, ["localhost"])
    assert renewed.ca_pem != due.ca_pem and not tls.renewal_due(renewed.cert)
    mounted = tls.generate_certs(tmp_path, ["localhost"], days=10)
    monkeypatch.setattr(tls, "renewable", lambda directory: False)          # a read-only Secret volume
    assert tls.load_or_generate(tmp_path, ["localhost"]) == mounted


async def test_a_running_guard_renews_its_certificate_publishing_the_new_ca_first(
        cluster: FakeCluster, kube: k.Kube, tmp_path: Path, monkeypatch: Any) -> None:
    cluster.server.register_kind(api.VALIDATING_WEBHOOKS)
    cluster.server.create("admissionregistration.k8s.io", "validatingwebhookconfigurations", "", {
        "metadata": {"name": "dispatch-guard"}, "webhooks": [
            {"name": "guard.dispatch.phpboyscout.uk", "clientConfig": {"url": "https://127.0.0.1/validate-trainjob"}}]})
    running = await g.start(kube, host="127.0.0.1", port=0, cert_dir=str(tmp_path / "certs"),
                            hosts=["localhost", "127.0.0.1"], webhook="dispatch-guard", every=3600)
    try:
        await running.refresh(switch_delay=0)        # what the first round of upkeep does: publish
        first = (tmp_path / "certs" / "ca.crt").read_bytes()
        (tmp_path / "first-ca.crt").write_bytes(first)
        assert (await post(running.port, tmp_path / "first-ca.crt", [b"{}"]))[0][0] == 400   # served, trusted
        monkeypatch.setattr(tls, "RENEW_BEFORE", dt.timedelta(days=400))        # the end is now near
        await running.refresh(switch_delay=0)
        second = (tmp_path / "certs" / "ca.crt").read_bytes()
        assert second != first and running.certs.ca_pem == second
        hook = cluster.server.get("admissionregistration.k8s.io", "validatingwebhookconfigurations", "",
                                  "dispatch-guard")
        assert hook is not None
        bundle = base64.b64decode(hook["webhooks"][0]["clientConfig"]["caBundle"])
        assert first.strip() in bundle and second.strip() in bundle         # old and new both trusted
        # new connections get the certificate the new CA signed; the old CA no longer verifies it
        assert (await post(running.port, tmp_path / "certs" / "ca.crt", [b"{}"]))[0][0] == 400
        try:
            await post(running.port, tmp_path / "first-ca.crt", [b"{}"])
            raise AssertionError("the old certificate is still served")
        except ssl.SSLCertVerificationError:
            pass
    finally:
        await running.close()


async def test_files_replaced_by_their_owner_are_served_without_a_restart(
        cluster: FakeCluster, kube: k.Kube, tmp_path: Path) -> None:
    """cert-manager renews its Secret in place; the guard must serve the new files (else, with
    failurePolicy Fail, every start is refused once the old certificate ends)."""
    mounted = tmp_path / "mounted"
    tls.generate_certs(mounted, ["localhost", "127.0.0.1"])
    running = await g.start(kube, host="127.0.0.1", port=0, cert_dir=str(mounted),
                            hosts=["localhost"], webhook="", every=3600)
    try:
        renewed = tls.generate_certs(tmp_path / "renewed", ["localhost", "127.0.0.1"])
        for name in ("tls.key", "tls.crt", "ca.crt"):
            (mounted / name).write_bytes((tmp_path / "renewed" / name).read_bytes())
        await running.refresh(switch_delay=0)
        assert running.reloads == 1 and running.certs.ca_pem == renewed.ca_pem
        assert (await post(running.port, tmp_path / "renewed" / "ca.crt", [b"{}"]))[0][0] == 400
        await running.refresh(switch_delay=0)
        assert running.reloads == 1                      # unchanged files are not reloaded again
    finally:
        await running.close()


async def test_a_renewed_ca_is_published_to_enrolments_mutating_configuration_too(
        cluster: FakeCluster, kube: k.Kube, tmp_path: Path, monkeypatch: Any) -> None:
    """Enrolment's webhook (same name) must trust the guard's CA as the validating one does, or every
    create in an enrolled namespace is refused (failurePolicy Fail)."""
    for res, plural, path in ((api.VALIDATING_WEBHOOKS, "validatingwebhookconfigurations", g.PATH),
                              (api.MUTATING_WEBHOOKS, "mutatingwebhookconfigurations", g.MUTATE_PATH)):
        cluster.server.register_kind(res)
        cluster.server.create("admissionregistration.k8s.io", plural, "", {
            "metadata": {"name": "dispatch-guard"}, "webhooks": [
                {"name": "x.dispatch.phpboyscout.uk", "clientConfig": {"url": f"https://127.0.0.1{path}"}}]})

    def bundle(plural: str) -> bytes:
        hook = cluster.server.get("admissionregistration.k8s.io", plural, "", "dispatch-guard")
        assert hook is not None
        return base64.b64decode(hook["webhooks"][0]["clientConfig"].get("caBundle") or "")

    running = await g.start(kube, host="127.0.0.1", port=0, cert_dir=str(tmp_path / "certs"),
                            hosts=["localhost", "127.0.0.1"], webhook="dispatch-guard", every=3600)
    try:
        await running.refresh(switch_delay=0)
        first = (tmp_path / "certs" / "ca.crt").read_bytes()
        assert first.strip() in bundle("mutatingwebhookconfigurations")
        monkeypatch.setattr(tls, "RENEW_BEFORE", dt.timedelta(days=400))
        await running.refresh(switch_delay=0)
        second = (tmp_path / "certs" / "ca.crt").read_bytes()
        for plural in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
            assert first.strip() in bundle(plural) and second.strip() in bundle(plural)
    finally:
        await running.close()


async def test_a_replica_is_ready_only_once_the_api_server_can_trust_it(
        cluster: FakeCluster, kube: k.Kube, tmp_path: Path) -> None:
    """/readyz follows Running.ready(): a replica whose CA is not yet in the caBundle would fail every review
    (failurePolicy Fail), so the Service must not send it any until the CA is published."""
    cluster.server.register_kind(api.VALIDATING_WEBHOOKS)
    cluster.server.create("admissionregistration.k8s.io", "validatingwebhookconfigurations", "", {
        "metadata": {"name": "dispatch-guard"}, "webhooks": [
            {"name": "guard.dispatch.phpboyscout.uk", "clientConfig": {"url": "https://127.0.0.1/validate-trainjob"}}]})
    fault = cluster.server.inject(method="PATCH", path="validatingwebhookconfigurations", status=403, times=10**6)
    running = await g.start(kube, host="127.0.0.1", port=0, cert_dir=str(tmp_path / "certs"),
                            hosts=["localhost", "127.0.0.1"], webhook="dispatch-guard", every=0.05)
    try:
        assert running.ready() == (False, "guard CA not yet in the caBundle of dispatch-guard")
        await asyncio.sleep(0.3)                          # several rounds of upkeep, each forbidden
        assert running.ready() == (False, "guard CA not yet in the caBundle of dispatch-guard")
        fault.times = 0
        for _ in range(100):
            if running.ready()[0]:
                break
            await asyncio.sleep(0.05)
        assert running.ready() == (True, "guard serving")
        hook = cluster.server.get("admissionregistration.k8s.io", "validatingwebhookconfigurations", "",
                                  "dispatch-guard")
        assert hook is not None and hook["webhooks"][0]["clientConfig"].get("caBundle")
    finally:
        await running.close()

    # cert-manager keeps the bundle (no webhook to publish to): ready as soon as the files are loaded
    own = await g.start(kube, host="127.0.0.1", port=0, cert_dir=str(tmp_path / "certs"),
                        hosts=["localhost"], webhook="", every=3600)
    try:
        assert own.ready() == (True, "guard serving")
    finally:
        await own.close()
