"""Who the guard answers, and what it tells a caller that is not the API server (issue 35 item 8).

Anyone who reaches the guard's port can POST an AdmissionReview naming any namespace, object and user.
The guard's answers come from reads with the controller's ServiceAccount, which may read every namespace's
pods, Nodes and identity records; so a denial names what the read found only when the review is of a
stored object's write (what the API server sends), and a review's ``userInfo`` is logged as claimed unless
the connection was verified as the API server's. The opt-in client certificate check is exercised against
the real guard server over real TLS with a generated CA.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from structlog.testing import capture_logs

from dispatch import AsyncAdapter, JobSpec
from dispatch import _api as api
from dispatch import _kube as k
from dispatch.controller import Config
from dispatch.controller import _guard as g
from dispatch.controller import _tls as tls
from dispatch.testing import FakeCluster

NAME = "llama-s1"
Obj = dict[str, Any]
FORGED_USER = "system:admin\n{\"msg\": \"a line of its own\"}" + "x" * 1000


async def held_with_terminating_pod(adapter: AsyncAdapter, cluster: FakeCluster) -> Obj:
    await adapter.open(JobSpec(job_id="llama", submission="s1"))
    await adapter.release(NAME)
    cluster.settle()
    await adapter.hold(NAME)
    cluster.settle()  # the grace period is not over: the pod stays Terminating on its node
    return cluster.pods(NAME)[0]


def review(operation: str, new: Obj, old: Obj | None = None, *, user: str = "someone",
           namespace: str = "default") -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "req-1", "operation": operation, "namespace": namespace, "name": new["metadata"]["name"],
        "object": new, "oldObject": old, "userInfo": {"username": user}}}).encode()


async def post(port: int, ca: Path, bodies: list[bytes], path: str = g.PATH, *,
               client: tuple[Path, Path] | None = None) -> list[tuple[int, Obj]]:
    """POST each body on one TLS connection verified against ``ca`` (with ``client``'s certificate and key
    when given); (status, JSON) per answer."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        ctx.load_cert_chain(str(client[0]), str(client[1]))
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


def creates_of(pod: Obj) -> tuple[Obj, Obj, Obj]:
    """A create of the rank's next pod as its Job controller makes it (owned by the same Job), the same without
    an owner, and the same owned by a Job that does not exist."""
    replacement = copy.deepcopy(pod)
    meta = replacement["metadata"]
    meta.update(name=f"{meta['name'][:-5]}zzzzz", uid="")
    for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion", "managedFields"):
        meta.pop(key, None)
    replacement["spec"].pop("nodeName", None)
    replacement["status"] = {}
    no_owner = copy.deepcopy(replacement)
    no_owner["metadata"].pop("ownerReferences")
    other_owner = copy.deepcopy(replacement)
    other_owner["metadata"]["ownerReferences"][0]["uid"] = "11111111-1111-1111-1111-111111111111"
    return replacement, no_owner, other_owner


def message(answer: Obj) -> str:
    response = answer["response"]
    assert response["allowed"] is False
    return str(response["status"]["message"])


# --------------------------------------------------------------------------- what a made-up review learns


async def test_a_made_up_review_learns_no_pod_or_node_and_the_api_servers_review_names_them(
        adapter: AsyncAdapter, cluster: FakeCluster, kube: k.Kube, tmp_path: Path) -> None:
    """A review of another namespace's object, made up by any in-cluster caller, named the pods and Nodes the
    controller's read found (issue 35 item 8). Now: a TrainJob update whose old object is not the stored one,
    a create, and a pod create whose controller is no Job of the submission are refused naming none of them;
    the API server's reviews (the stored object's update, the Job controller's pod create) still name them."""
    pod = await held_with_terminating_pod(adapter, cluster)
    pod_name, node = str(pod["metadata"]["name"]), str(pod["spec"]["nodeName"])
    stored = cluster.server.get(api.TRAINJOBS.group, "trainjobs", "default", NAME)
    assert stored is not None
    start = copy.deepcopy(stored)
    start["spec"]["suspend"] = False
    made_up_old = copy.deepcopy(stored)
    made_up_old["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    made_up_start = copy.deepcopy(start)
    made_up_start["metadata"]["uid"] = made_up_old["metadata"]["uid"]
    created = copy.deepcopy(start)
    del created["metadata"]["resourceVersion"]

    replacement, no_owner, other_owner = creates_of(pod)
    meta = replacement["metadata"]

    running = await g.start(kube, host="127.0.0.1", port=0, cert_dir=str(tmp_path / "certs"),
                            hosts=["localhost", "127.0.0.1"], webhook="")
    try:
        ca = tmp_path / "certs" / "ca.crt"
        trainjobs = await post(running.port, ca, [review("UPDATE", made_up_start, made_up_old),
                                                  review("CREATE", created), review("UPDATE", start, stored)])
        pods = await post(running.port, ca, [review("CREATE", no_owner), review("CREATE", other_owner),
                                             review("CREATE", replacement)], path=g.POD_PATH)
    finally:
        await running.close()
    assert [status for status, _ in trainjobs + pods] == [200] * 6
    (_, made_up), (_, create), (_, api_server) = trainjobs
    (_, ownerless), (_, foreign), (_, by_job) = pods

    for answer in (made_up, create, ownerless, foreign):
        said = message(answer)
        assert pod_name not in said and f" on {node}" not in said and "Ready=" not in said, said
        assert "remaining pods" not in said and "identity record" not in said, said
    assert message(made_up).startswith(
        f"trainjob {NAME} cannot start; the guard names what stands in the way only in a review of a stored "
        f"object's write (namespace default holds no TrainJob {NAME} of uid 00000000-")
    assert message(create) == (f"trainjob {NAME} cannot start: a dispatch TrainJob is created suspended and started "
                               "by `dispatch release` (or Kueue through dispatch's admission check)")
    assert message(ownerless).startswith(
        f"pod {meta['name']} cannot start while a pod of submission llama/s1 may still run; the guard names what "
        "stands in the way only in a review of a stored object's write (namespace default holds no Job of that "
        "submission of uid (none) controlling it)")
    assert "of uid 11111111-1111-1111-1111-111111111111 controlling it" in message(foreign)
    # the API server's own reviews: the stored TrainJob's update, and the pod its Job creates
    assert message(api_server).startswith(f"trainjob {NAME} cannot start: remaining pods: {pod_name} on {node}")
    assert f"may still run: remaining pods: {pod_name} on {node}" in message(by_job)


async def test_a_reviews_user_is_logged_as_claimed_bounded_and_escaped(
        adapter: AsyncAdapter, cluster: FakeCluster, kube: k.Kube) -> None:
    """A made-up ``userInfo`` was logged as ``user``, as a fact, whole (issue 35 item 8): the log line now says
    the review *claims* it, bounded, with its control characters escaped."""
    await held_with_terminating_pod(adapter, cluster)
    stored = cluster.server.get(api.TRAINJOBS.group, "trainjobs", "default", NAME)
    assert stored is not None
    start = copy.deepcopy(stored)
    start["spec"]["suspend"] = False
    with capture_logs() as logs:
        answer = await g.Guard(kube).review(json.loads(review("UPDATE", start, stored, user=FORGED_USER)), 10.0)
    assert answer["response"]["allowed"] is False
    [line] = [e for e in logs if e["event"] == "guard denied"]
    assert "user" not in line
    claimed = line["claimed_user"]
    assert claimed.startswith("system:admin\\n{") and "\n" not in claimed
    assert len(claimed) < g.CLAIM_LIMIT + 40 and claimed.endswith("more)")
    assert (line["namespace"], line["name"], line["operation"]) == ("default", NAME, "UPDATE")


# --------------------------------------------------------------------------- the client certificate option


def _ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def _client(directory: Path, ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate], name: str
            ) -> tuple[Path, Path]:
    """A client certificate for ``name`` (its common name), signed by ``ca``, as the API server's would be."""
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    crt, pem = directory / f"{name}.crt", directory / f"{name}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


async def refused_in_handshake(port: int, ca: Path, body: bytes, client: tuple[Path, Path] | None) -> str:
    """What a caller the TLS handshake refuses sees: the connection fails before any answer."""
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)) as caught:
        await post(port, ca, [body], client=client)
    return type(caught.value).__name__


async def test_with_a_client_ca_only_the_named_api_server_is_answered(
        adapter: AsyncAdapter, cluster: FakeCluster, kube: k.Kube, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--guard-client-ca``: a caller without a certificate, or with one of another CA, is refused in the TLS
    handshake, even a CA the system trusts; ``--guard-client-names``: one the CA signed for another name is
    answered 403 before its review is read; the API server's certificate gets the answer, and its review's user
    is logged as a fact."""
    pod = await held_with_terminating_pod(adapter, cluster)
    stored = cluster.server.get(api.TRAINJOBS.group, "trainjobs", "default", NAME)
    assert stored is not None
    start = copy.deepcopy(stored)
    start["spec"]["suspend"] = False
    body = review("UPDATE", start, stored, user="alice")

    trusted, other = _ca("webhook-clients"), _ca("someone-else")
    ca_file = tmp_path / "client-ca.crt"
    ca_file.write_bytes(trusted[1].public_bytes(serialization.Encoding.PEM))
    api_server = _client(tmp_path / "c", trusted, "kube-apiserver-webhook-client")
    kubelet = _client(tmp_path / "c", trusted, "system:node:node-0")
    stranger = _client(tmp_path / "o", other, "kube-apiserver-webhook-client")
    system = tmp_path / "system-cas.pem"  # the system's trust store, as OpenSSL finds it, holds the other CA
    system.write_bytes(other[1].public_bytes(serialization.Encoding.PEM))
    monkeypatch.setenv("SSL_CERT_FILE", str(system))
    clients = Config(guard_client_ca=str(ca_file), guard_client_names="kube-apiserver-webhook-client").guard_clients()
    assert clients is not None and clients.names == {"kube-apiserver-webhook-client"}

    registry_free = await g.start(kube, host="127.0.0.1", port=0, cert_dir=str(tmp_path / "certs"),
                                  hosts=["localhost", "127.0.0.1"], webhook="", clients=clients)
    try:
        server_ca = tmp_path / "certs" / "ca.crt"
        await refused_in_handshake(registry_free.port, server_ca, body, None)
        await refused_in_handshake(registry_free.port, server_ca, body, stranger)
        assert registry_free.guard.reviews == 0
        [(status, refused)] = await post(registry_free.port, server_ca, [body], client=kubelet)
        assert status == 403 and "--guard-client-names" in refused["error"]
        assert registry_free.guard.reviews == 0
        with capture_logs() as logs:
            [(status, answered)] = await post(registry_free.port, server_ca, [body], client=api_server)
    finally:
        await registry_free.close()
    assert status == 200
    assert message(answered).startswith(f"trainjob {NAME} cannot start: remaining pods: {pod['metadata']['name']}")
    [line] = [e for e in logs if e["event"] == "guard denied"]
    assert (line["user"], line["caller"]) == ("alice", "kube-apiserver-webhook-client")
    assert "claimed_user" not in line


async def test_with_a_client_ca_and_no_names_any_certificate_of_the_ca_is_answered(
        kube: k.Kube, tmp_path: Path) -> None:
    """Without names the CA alone decides (the docs say: a CA that signs nothing else); still no caller without
    one of its certificates is answered, and the system's CAs count for nothing."""
    trusted = _ca("webhook-clients")
    ca_file = tmp_path / "client-ca.crt"
    ca_file.write_bytes(trusted[1].public_bytes(serialization.Encoding.PEM))
    anyone = _client(tmp_path / "c", trusted, "anyone")
    # the client CA is the only one a client certificate is verified against (no system CA)
    clients = g.ClientAuth.load(str(ca_file))
    assert [c["subject"] for c in g._context(clients).get_ca_certs()] == [((("commonName", "webhook-clients"),),)]
    running = await g.start(kube, host="127.0.0.1", port=0, cert_dir=str(tmp_path / "certs"),
                            hosts=["localhost", "127.0.0.1"], webhook="", clients=clients)
    try:
        server_ca = tmp_path / "certs" / "ca.crt"
        # the guard's own serving CA signed a certificate too, but it is not the client CA
        own = (tmp_path / "certs" / "tls.crt", tmp_path / "certs" / "tls.key")
        await refused_in_handshake(running.port, server_ca, b"{}", own)
        [(status, answer)] = await post(running.port, server_ca, [json.dumps({"request": {
            "uid": "u", "operation": "DELETE", "namespace": "default", "object": None}}).encode()], client=anyone)
    finally:
        await running.close()
    assert status == 200 and answer["response"] == {"uid": "u", "allowed": True}


async def test_a_renewed_serving_certificate_keeps_asking_for_the_client_certificate(
        kube: k.Kube, tmp_path: Path) -> None:
    """The guard's own certificate is replaced while it serves (its renewal, cert-manager's rotation): the
    handshakes after the reload still refuse a caller without a client certificate, and still verify the API
    server's against the client CA (a reloaded context without it refuses the API server: every start)."""
    trusted = _ca("webhook-clients")
    ca_file = tmp_path / "client-ca.crt"
    ca_file.write_bytes(trusted[1].public_bytes(serialization.Encoding.PEM))
    api_server = _client(tmp_path / "c", trusted, "kube-apiserver-webhook-client")
    running = await g.start(kube, host="127.0.0.1", port=0, cert_dir=str(tmp_path / "certs"),
                            hosts=["localhost", "127.0.0.1"], webhook="", clients=g.ClientAuth.load(str(ca_file)))
    allowed = json.dumps({"request": {"uid": "u", "operation": "DELETE", "namespace": "default"}}).encode()
    try:
        old_ca = (tmp_path / "certs" / "ca.crt").read_bytes()
        fresh = tls.generate_certs(tmp_path / "certs", ["localhost", "127.0.0.1"])
        assert fresh.ca_pem != old_ca and running.upkeep.context.reload()
        server_ca = tmp_path / "certs" / "ca.crt"  # the new one: the handshake serves the renewed certificate
        await refused_in_handshake(running.port, server_ca, allowed, None)
        [(status, answer)] = await post(running.port, server_ca, [allowed], client=api_server)
    finally:
        await running.close()
    assert status == 200 and answer["response"]["allowed"] is True


def test_a_client_ca_that_cannot_be_used_stops_the_start_naming_the_option(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_text("not a certificate\n")
    with pytest.raises(ValueError, match=r"--guard-client-ca .*empty\.pem holds no PEM certificate"):
        Config(guard_client_ca=str(empty)).guard_clients()
    with pytest.raises(ValueError, match=r"--guard-client-ca .*missing\.pem: No such file"):
        Config(guard_client_ca=str(tmp_path / "missing.pem")).guard_clients()
    with pytest.raises(ValueError, match="--guard-client-names needs --guard-client-ca"):
        Config(guard_client_names="kube-apiserver").guard_clients()
    assert Config().guard_clients() is None
