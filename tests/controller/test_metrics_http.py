"""/metrics as clusters expect it: next to the probes, on localhost only, or over HTTPS for callers the API
server authenticates (TokenReview) and authorizes for ``get /metrics`` (SubjectAccessReview).

On the fake cluster, with :class:`dispatch.controller.testing.AccessReviews` playing the two review
endpoints; the same listener against the real API server is in ``test_testbed.py``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry

from dispatch import _kube as k
from dispatch.controller import Config, ControllerOptions, MetricsServing, run_from_cli
from dispatch.controller import _http as h
from dispatch.controller.testing import AccessReviews, FakeKueue
from dispatch.testing import FakeCluster

from .conftest import BASE, running


@pytest.fixture
def reviews(cluster: FakeCluster, kueue: FakeKueue) -> AccessReviews:
    r = AccessReviews(cluster)
    r.add_user("prom-token", "system:serviceaccount:monitoring:prometheus")
    r.allow("system:serviceaccount:monitoring:prometheus")
    r.add_user("other-token", "system:serviceaccount:default:other")
    return r


@pytest.fixture
async def rkube(reviews: AccessReviews) -> AsyncIterator[k.Kube]:
    kb = k.Kube.connect(namespace="default", transport=reviews.transport())
    yield kb
    await kb.aclose()


def insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


@asynccontextmanager
async def client(base: str, verify: ssl.SSLContext | bool = True) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(base_url=base, verify=verify, timeout=10) as http:
        yield http


async def test_metrics_on_a_localhost_listener_of_their_own(kube: k.Kube, kueue: FakeKueue) -> None:
    serving = MetricsServing.parse("127.0.0.1:0")
    async with running(kube, BASE, metrics_port=0, metrics_serving=serving) as ctl:
        assert ctl.http_port and ctl.metrics_port and ctl.http_port != ctl.metrics_port
        async with client(f"http://127.0.0.1:{ctl.http_port}") as probes:
            assert (await probes.get("/healthz")).status_code == 200
            assert (await probes.get("/readyz")).status_code == 200
            assert (await probes.get("/metrics")).status_code == 404      # moved off the probe port
        async with client(f"http://127.0.0.1:{ctl.metrics_port}") as metrics:
            got = await metrics.get("/metrics")
            assert got.status_code == 200 and "dispatch_admissions_total" in got.text
            assert (await metrics.get("/readyz")).status_code == 404      # probes stay on theirs
            assert (await metrics.post("/metrics")).status_code == 405


async def test_secure_metrics_let_through_only_authorized_tokens(
    rkube: k.Kube, reviews: AccessReviews
) -> None:
    serving = MetricsServing.parse("127.0.0.1:0", secure=True)
    async with running(rkube, BASE, metrics_port=0, metrics_serving=serving) as ctl:
        base = f"https://127.0.0.1:{ctl.metrics_port}"
        async with client(base, verify=insecure()) as https:
            none = await https.get("/metrics")
            assert none.status_code == 401 and none.headers["www-authenticate"].startswith("Bearer")
            assert reviews.reviews == []                                    # no token: nothing to review
            bad = await https.get("/metrics", headers={"Authorization": "Bearer wrong"})
            assert bad.status_code == 401
            other = await https.get("/metrics", headers={"Authorization": "Bearer other-token"})
            assert other.status_code == 403 and "may not get /metrics" in other.text
            before = len(reviews.reviews)
            ok = await https.get("/metrics", headers={"Authorization": "Bearer prom-token"})
            assert ok.status_code == 200 and "dispatch_admissions_total" in ok.text
            assert [kind for kind, _ in reviews.reviews[before:]] == ["token", "access"]
            access = reviews.reviews[-1][1]["spec"]
            assert access["user"] == "system:serviceaccount:monitoring:prometheus"
            assert access["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
            assert access["uid"] == "uid-system:serviceaccount:monitoring:prometheus"
            again = await https.get("/metrics", headers={"Authorization": "Bearer prom-token"})
            assert again.status_code == 200 and len(reviews.reviews) == before + 2  # answered from the cache
            assert (await https.get("/readyz", headers={"Authorization": "Bearer prom-token"})).status_code == 404
        async with client(base.replace("https", "http")) as plain:
            with pytest.raises(httpx2.HTTPError):                        # no plain HTTP on the secure port
                await plain.get("/metrics")
        async with client(f"http://127.0.0.1:{ctl.http_port}") as probes:  # probes stay plain, unauthenticated
            assert (await probes.get("/readyz")).status_code == 200
            assert (await probes.get("/metrics")).status_code == 404


async def test_a_review_the_api_server_cannot_answer_is_a_500_and_not_cached(
    rkube: k.Kube, reviews: AccessReviews
) -> None:
    authorizer = h.Authorizer(rkube)
    reviews.fail = True
    assert await authorizer.check("Bearer prom-token", "/metrics") == (500, "could not review the token with "
                                                                             "the API server")
    reviews.fail = False
    assert (await authorizer.check("Bearer prom-token", "/metrics"))[0] == 200
    assert (await authorizer.check("Basic abc", "/metrics"))[0] == 401
    assert (await authorizer.check(None, "/metrics"))[0] == 401


def _cert(directory: Path, name: str) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (directory / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    (directory / "tls.crt").write_bytes(pem)
    return pem


async def test_secure_metrics_serve_the_mounted_certificate_and_follow_its_rotation(
    rkube: k.Kube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(h._Certificates, "recheck_seconds", 0.0)
    first = _cert(tmp_path, "first")
    serving = MetricsServing.parse("127.0.0.1:0", secure=True, cert_dir=str(tmp_path))
    async with running(rkube, BASE, metrics_port=None, metrics_serving=serving) as ctl:
        base = f"https://127.0.0.1:{ctl.metrics_port}"
        auth = {"Authorization": "Bearer prom-token"}
        async with client(base, verify=ssl.create_default_context(cadata=first.decode())) as https:
            assert (await https.get("/metrics", headers=auth)).status_code == 200   # verified against tls.crt
        second = _cert(tmp_path, "second")
        async with client(base, verify=ssl.create_default_context(cadata=second.decode())) as https:
            assert (await https.get("/metrics", headers=auth)).status_code == 200   # the rotated one
        async with client(base, verify=ssl.create_default_context(cadata=first.decode())) as https:
            with pytest.raises(httpx2.ConnectError):
                await https.get("/metrics", headers=auth)


def test_bad_metrics_options_are_refused_with_a_clear_error(tmp_path: Path) -> None:
    assert MetricsServing.parse(":8443", secure=True) == MetricsServing("0.0.0.0", 8443, True, None)
    assert MetricsServing.parse("[::1]:9090").host == "::1"
    for bad in ("8443", "host:", "host:http", ":70000"):
        with pytest.raises(ValueError, match="is not HOST:PORT"):
            MetricsServing.parse(bad)
    with pytest.raises(ValueError, match="needs secure metrics"):
        MetricsServing.parse(":8443", cert_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"lacks tls\.crt, tls\.key"):
        MetricsServing.parse(":8443", secure=True, cert_dir=str(tmp_path))


def test_the_entry_point_refuses_bad_metrics_options_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "none")
    assert run_from_cli(ControllerOptions(kubeconfig=missing, metrics_port=0, leader_elect=False,
                                          metrics_bind_address="nonsense")) == 1
    assert "is not HOST:PORT" in capsys.readouterr().err
    assert run_from_cli(ControllerOptions(kubeconfig=missing, metrics_port=0, leader_elect=False,
                                          metrics_secure=True)) == 1
    assert "pass --metrics-bind-address" in capsys.readouterr().err


async def test_a_secure_listener_needs_the_api_server() -> None:
    with pytest.raises(ValueError, match="a Kube is needed"):
        await h.serve_metrics(MetricsServing("127.0.0.1", 0, secure=True), registry=CollectorRegistry())


def test_config_default_keeps_metrics_next_to_the_probes() -> None:
    assert Config().metrics_serving is None
