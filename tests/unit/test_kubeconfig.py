"""Kubeconfigs: kubectl's lookup and merge rules, and one clear line (plus a hint, exit 4) for every way a
kubeconfig can be unusable, instead of a traceback."""

from __future__ import annotations

import base64
import http.server
import json
import os
import ssl
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dispatch import Refused
from dispatch import _kube as k
from dispatch import _kubeconfig as kc
from dispatch.cli import EXIT_REFUSED, app
from dispatch.testbed._pki import ensure_pki


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pki")
    ensure_pki(path)
    return path


@pytest.fixture(autouse=True)
def no_ambient_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Neither this machine's KUBECONFIG, its ~/.kube/config nor a pod's service account leaks in."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(kc, "SERVICE_ACCOUNT", tmp_path / "no-service-account")


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def config(cluster: dict[str, Any] | None = None, user: dict[str, Any] | None = None,
           top: dict[str, Any] | None = None) -> str:
    """A one-context kubeconfig (cluster c, user u, context a) with the given bodies."""
    doc: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster if cluster is not None else {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": user if user is not None else {"token": "t"}}],
        "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "a",
    }
    doc.update(top or {})
    return yaml.safe_dump(doc)


SERVER = "https://127.0.0.1:6443"

# (id, kubeconfig text or a function of the PKI dir giving it, reason, words the one-line message must hold)
CORPUS: list[tuple[str, str | Callable[[Path], str], str, str]] = [
    ("not-yaml", "clusters: [\n", "BadKubeconfig", "is not valid YAML: expected the node content"),
    ("tab-indented", "clusters:\n\t- name: c\n", "BadKubeconfig", "is not valid YAML"),
    ("list", "- clusters\n- users\n", "BadKubeconfig", "is a list, not a mapping"),
    ("scalar", "just some text\n", "BadKubeconfig", "is a str, not a mapping"),
    ("empty", "", "BadKubeconfig", "is empty: it defines no clusters"),
    ("only-comments", "# nothing here\n", "BadKubeconfig", "is empty"),
    ("empty-mapping", "{}\n", "BadKubeconfig", "is empty"),
    ("clusters-a-mapping", "clusters: {c: {server: x}}\ncontexts: []\n", "BadKubeconfig",
     "clusters must be a list"),
    ("entry-without-name", "clusters: [{cluster: {server: x}}]\n", "BadKubeconfig",
     "clusters[0] must be a mapping with a name"),
    ("cluster-body-a-list", "clusters: [{name: c, cluster: [x]}]\n", "BadKubeconfig",
     "clusters[c].cluster must be a mapping"),
    ("current-context-a-list", config(top={"current-context": ["a"]}), "BadKubeconfig",
     "current-context must be a string"),
    ("no-current-context", config(top={"current-context": None}), "NoContext",
     "sets no current-context; pass --context (contexts: a)"),
    ("unknown-current-context", config(top={"current-context": "zz"}), "NoContext", "context 'zz' not found"),
    ("context-names-missing-cluster",
     config(top={"contexts": [{"name": "a", "context": {"cluster": "nope", "user": "u"}}]}), "BadKubeconfig",
     "contexts[a].context.cluster names 'nope', which"),
    ("context-names-missing-user",
     config(top={"contexts": [{"name": "a", "context": {"cluster": "c", "user": "nobody"}}]}), "BadKubeconfig",
     "contexts[a].context.user names 'nobody'"),
    ("context-without-cluster", config(top={"contexts": [{"name": "a", "context": {"user": "u"}}]}), "BadKubeconfig",
     "contexts[a].context.cluster is missing"),
    ("server-missing", config({}), "BadKubeconfig", "clusters[c].cluster.server is missing"),
    ("server-a-number", config({"server": 6443}), "BadKubeconfig", "server must be a string (got int 6443)"),
    ("server-not-http", config({"server": "ftp://example.com"}), "BadKubeconfig", "is not an http(s) URL"),
    # a server URL that can reach no server is bad input (exit 4), not a server that is down (exit 3)
    ("server-scheme-without-slashes", config({"server": "https:example.com"}), "BadKubeconfig",
     "'https:example.com' has no scheme and is not a bare host[:port]; write it as https://HOST[:PORT][/PATH]"),
    ("server-scheme-without-colon", config({"server": "https//example.com"}), "BadKubeconfig",
     "has no scheme and is not a bare host[:port]"),
    ("server-without-host", config({"server": "https://"}), "BadKubeconfig", "'https://' has no host"),
    ("server-path-without-host", config({"server": "https:///api"}), "BadKubeconfig", "has no host"),
    ("server-port-not-a-number", config({"server": "https://example.com:port"}), "BadKubeconfig",
     "is not a URL (Port could not be cast to integer value as 'port')"),
    ("server-port-too-large", config({"server": "https://example.com:70000"}), "BadKubeconfig",
     "is not a URL (Port out of range"),
    ("server-port-zero", config({"server": "https://example.com:0"}), "BadKubeconfig", "has port 0"),
    ("server-ipv6-unclosed", config({"server": "https://[::1:6443"}), "BadKubeconfig",
     "is not a URL (Invalid IPv6 URL)"),
    ("server-with-a-space", config({"server": "https://exa mple.com"}), "BadKubeconfig",
     "contains a space or control character"),
    ("server-host-not-a-name", config({"server": "https://ex*ample.com"}), "BadKubeconfig",
     "has a host 'ex*ample.com' that is not a DNS name or IP address"),
    ("server-bare-with-a-path", config({"server": "example.com/api"}), "BadKubeconfig",
     "has no scheme and is not a bare host[:port]"),
    ("insecure-not-a-bool", config({"server": SERVER, "insecure-skip-tls-verify": "yes please"}),
     "BadKubeconfig", "insecure-skip-tls-verify must be true or false"),
    ("ca-data-not-base64", config({"server": SERVER, "certificate-authority-data": "not base64!"}),
     "BadCertificate", "certificate-authority-data is not valid base64"),
    ("ca-data-not-pem", config({"server": SERVER, "certificate-authority-data": b64("hello")}),
     "BadCertificate", "certificate-authority-data is not a PEM certificate"),
    ("ca-data-a-key", lambda p: config({"server": SERVER, "certificate-authority-data": b64(
        (p / "ca.key").read_bytes())}), "BadCertificate", "is not a PEM certificate"),
    ("ca-file-missing", config({"server": SERVER, "certificate-authority": "/nonexistent/ca.crt"}),
     "BadCertificate", "certificate-authority /nonexistent/ca.crt: No such file"),
    ("ca-and-insecure", lambda p: config({"server": SERVER, "certificate-authority": str(p / "ca.crt"),
                                          "insecure-skip-tls-verify": True}),
     "BadKubeconfig", "sets both a certificate authority and insecure-skip-tls-verify"),
    ("client-cert-without-key", lambda p: config(user={"client-certificate-data": b64(
        (p / "admin.crt").read_bytes())}), "BadCertificate", "has a client certificate but no client key"),
    ("client-key-not-base64", lambda p: config(user={"client-certificate": str(p / "admin.crt"),
                                                     "client-key-data": "%%%"}),
     "BadCertificate", "client-key-data is not valid base64"),
    ("client-key-of-another-cert", lambda p: config(user={"client-certificate": str(p / "admin.crt"),
                                                          "client-key": str(p / "ca.key")}),
     "BadCertificate", "the client certificate and key cannot be used"),
    ("client-cert-garbage", config(user={"client-certificate-data": b64("garbage"),
                                         "client-key-data": b64("garbage")}),
     "BadCertificate", "cannot be used"),
    ("client-cert-file-missing", config(user={"client-certificate": "missing.crt", "client-key": "missing.key"}),
     "BadCertificate", "client-certificate"),
    ("token-file-missing", config(user={"tokenFile": "/nonexistent/token"}), "BadKubeconfig",
     "tokenFile /nonexistent/token does not exist"),
    ("token-a-number", config(user={"token": 12345}), "BadKubeconfig", "token must be a string (got int 12345)"),
    ("auth-provider", config(user={"auth-provider": {"name": "gcp"}}), "ExecCredential",
     "auth-provider (gcp) is not supported"),
    ("exec-old-api-version", config(user={"exec": {"apiVersion": "client.authentication.k8s.io/v1alpha1",
                                                   "command": "x"}}),
     "ExecCredential", "apiVersion 'client.authentication.k8s.io/v1alpha1' is not supported"),
    ("exec-without-command", config(user={"exec": {"apiVersion": "client.authentication.k8s.io/v1"}}),
     "BadKubeconfig", "exec.command is missing"),
    ("exec-args-a-string", config(user={"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                                 "command": "x", "args": "--a --b"}}),
     "BadKubeconfig", "exec.args must be a list of strings"),
    ("impersonated-groups-without-a-user", config(user={"token": "t", "as-groups": ["ml"]}), "BadImpersonation",
     "as-groups, as-uid or as-user-extra without as"),
    ("as-groups-a-string", config(user={"token": "t", "as": "bob", "as-groups": "ml"}), "BadKubeconfig",
     "as-groups must be a list of strings"),
    ("socks-proxy", config({"server": SERVER, "proxy-url": "socks5://127.0.0.1:1080"}), "BadKubeconfig",
     "supports http and https proxies only"),
]


def write(tmp_path: Path, text: str | Callable[[Path], str], pki: Path, name: str = "config") -> Path:
    path = tmp_path / name
    path.write_text(text(pki) if callable(text) else text)
    return path


@pytest.mark.parametrize(("text", "reason", "words"), [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_each_unusable_kubeconfig_is_refused_in_one_line_naming_where(
    tmp_path: Path, pki: Path, text: str | Callable[[Path], str], reason: str, words: str
) -> None:
    path = write(tmp_path, text, pki)
    with pytest.raises(Refused) as err:
        kc.load(path)
    assert err.value.reason == reason
    assert words in str(err.value)
    assert "\n" not in str(err.value)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(("text", "reason", "words"), [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_the_cli_prints_one_error_line_and_one_hint_and_exits_4(
    tmp_path: Path, pki: Path, text: str | Callable[[Path], str], reason: str, words: str
) -> None:
    path = write(tmp_path, text, pki)
    result = CliRunner().invoke(app, ["--kubeconfig", str(path), "status", "x"], env={"COLUMNS": "250"})
    assert result.exit_code == EXIT_REFUSED, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("error: ") and words in lines[0]
    assert lines[1].startswith("hint: ")
    assert "Traceback" not in result.output


def test_a_missing_explicit_file_that_looks_like_a_list_says_where_lists_go(tmp_path: Path) -> None:
    with pytest.raises(Refused, match=r"does not exist.*goes in KUBECONFIG") as err:
        kc.load(f"{tmp_path}/a{os.pathsep}{tmp_path}/b")
    assert err.value.reason == "NoKubeconfig"


def test_nothing_found_anywhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(Refused, match=r"no kubeconfig found: .*\.kube/config does not exist") as err:
        kc.load()
    assert err.value.reason == "NoKubeconfig"
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/x{os.pathsep}{tmp_path}/y")
    with pytest.raises(Refused, match="none of the files in KUBECONFIG exists"):
        kc.load()


# ---------------------------------------------------------------------------------------- kubectl's rules


def test_a_kubeconfig_list_merges_as_kubectl_does(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = tmp_path / "one" / "config"
    second = tmp_path / "two" / "config"
    third = tmp_path / "third"
    (tmp_path / "two" / "token").write_text("from-two\n")
    first.write_text(yaml.safe_dump({  # sets no current-context; its cluster "shared" wins
        "clusters": [{"name": "shared", "cluster": {"server": "https://first:6443", "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "one", "context": {"cluster": "shared"}}],
    }))
    second.write_text(yaml.safe_dump({
        "current-context": "two",
        "clusters": [{"name": "shared", "cluster": {"server": "https://second:6443"}}],
        "users": [{"name": "u2", "user": {"tokenFile": "token"}}],  # relative to this file's directory
        "contexts": [{"name": "two", "context": {"cluster": "shared", "user": "u2", "namespace": "team-b"}},
                     {"name": "one", "context": {"cluster": "nope"}}],  # "one" is taken by the first file
    }))
    third.write_text(yaml.safe_dump({"current-context": "one"}))
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join(
        [str(tmp_path / "missing"), str(first), "", str(second), str(third), str(first)]))
    conn = kc.load()
    assert conn.server == "https://first:6443"          # first file to define cluster "shared" wins
    assert conn.namespace == "team-b"                   # current-context "two" from the first file that sets one
    assert isinstance(conn.auth, kc.TokenFileAuth)
    assert conn.auth._read() == "Bearer from-two"
    assert conn.verify.verify_mode == ssl.CERT_NONE     # the first file's cluster, insecure
    one = kc.load(context="one")                        # the first file's "one", not the second's broken one
    assert one.server == "https://first:6443" and one.auth is None


def test_an_error_in_any_listed_file_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text(config())
    bad.write_text("- a list\n")
    monkeypatch.setenv("KUBECONFIG", f"{good}{os.pathsep}{bad}")
    with pytest.raises(Refused, match=f"kubeconfig {bad} is a list"):
        kc.load()


def test_kubeconfig_env_comes_before_home_and_home_before_in_cluster(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = tmp_path / "home" / ".kube"
    home.mkdir(parents=True)
    (home / "config").write_text(config({"server": "https://home:1"}))
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("pod-token")
    (sa / "namespace").write_text("in-pod")
    monkeypatch.setattr(kc, "SERVICE_ACCOUNT", sa)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    env = tmp_path / "env-config"
    env.write_text(config({"server": "https://env:1"}))
    monkeypatch.setenv("KUBECONFIG", str(env))
    assert kc.load().server == "https://env:1"
    monkeypatch.delenv("KUBECONFIG")
    assert kc.load().server == "https://home:1"
    (home / "config").unlink()
    with pytest.raises(Refused, match=r"ca\.crt"):        # in-cluster, but the pod's CA is missing
        kc.load()


def test_in_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pki: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("pod-token\n")
    (sa / "namespace").write_text("in-pod")
    (sa / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    monkeypatch.setattr(kc, "SERVICE_ACCOUNT", sa)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    conn = kc.load()
    assert (conn.server, conn.namespace) == ("https://[fd00::1]:443", "in-pod")
    assert conn.source == "in-cluster service account"
    assert isinstance(conn.auth, kc.TokenFileAuth)
    assert conn.auth._read() == "Bearer pod-token"


def test_relative_paths_resolve_against_the_file_and_a_bare_host_gets_https(tmp_path: Path, pki: Path) -> None:
    (tmp_path / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    (tmp_path / "c.crt").write_bytes((pki / "admin.crt").read_bytes())
    (tmp_path / "c.key").write_bytes((pki / "admin.key").read_bytes())
    path = tmp_path / "config"
    path.write_text(config({"server": "127.0.0.1:6443", "certificate-authority": "ca.crt"},
                           {"client-certificate": "c.crt", "client-key": "c.key"}))
    conn = kc.load(path)
    assert conn.server == "https://127.0.0.1:6443"
    assert conn.auth is None and conn.proxy is None
    path.write_text(config({"server": "http://api:8080", "proxy-url": "http://proxy:3128"}))
    assert (kc.load(path).server, kc.load(path).proxy) == ("http://api:8080", "http://proxy:3128")
    data = tmp_path / "data-config"
    data.write_text(config({"server": "https://127.0.0.1:6443", "certificate-authority-data": b64(
        (pki / "ca.crt").read_bytes())}, {"client-certificate-data": b64((pki / "admin.crt").read_bytes()),
                                          "client-key-data": b64((pki / "admin.key").read_bytes())}))
    assert kc.load(data).verify.verify_mode == ssl.CERT_REQUIRED


# ------------------------------------------------------------------------------- against a local server


@dataclass
class Served:
    """A local HTTP(S) server standing in for the API server: records each request's path and credentials."""

    url: str
    seen: list[tuple[str, str]] = field(default_factory=list)
    reply_401: int = 0
    reply_404: bool = False
    headers: list[dict[str, list[str]]] = field(default_factory=list)
    """Every header of each request, by lower-case name (a header sent twice has two values)."""


def _serve(tls: ssl.SSLContext | None) -> Iterator[Served]:
    served = Served("")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.seen.append((self.path, self.headers.get("Authorization", "")))
            sent: dict[str, list[str]] = {}
            for key, value in self.headers.items():
                sent.setdefault(key.lower(), []).append(value)
            served.headers.append(sent)
            if served.reply_401 > 0:
                served.reply_401 -= 1
                code, body = 401, {"kind": "Status", "code": 401, "reason": "Unauthorized", "message": "no"}
            elif served.reply_404:
                name = self.path.rsplit("/", 1)[-1]
                code, body = 404, {"kind": "Status", "code": 404, "reason": "NotFound",
                                   "message": f"trainjobs.trainer.kubeflow.org {name!r} not found"}
            else:
                code, body = 200, {"kind": "Pod", "metadata": {"name": "x"}}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    served.url = f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def plain_server() -> Iterator[Served]:
    yield from _serve(None)


@pytest.fixture
def tls_server(pki: Path) -> Iterator[Served]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki / "admin.crt", pki / "admin.key")
    ctx.load_verify_locations(pki / "ca.crt")
    ctx.verify_mode = ssl.CERT_REQUIRED  # a client certificate signed by the CA, as the testbed's API server asks
    yield from _serve(ctx)


async def get_twice(path: Path, context: str | None = None) -> None:
    kube = k.Kube.connect(kubeconfig=path, context=context)
    try:
        await kube.get(k.PODS, "x")
        await kube.get(k.PODS, "y")
    finally:
        await kube.aclose()


async def test_tls_with_the_ca_and_a_client_certificate_from_data(tmp_path: Path, pki: Path,
                                                                  tls_server: Served) -> None:
    path = tmp_path / "config"
    path.write_text(config({"server": tls_server.url, "certificate-authority-data": b64(
        (pki / "ca.crt").read_bytes())}, {"client-certificate-data": b64((pki / "admin.crt").read_bytes()),
                                          "client-key-data": b64((pki / "admin.key").read_bytes())}))
    await get_twice(path)
    assert [p for p, _ in tls_server.seen] == ["/api/v1/namespaces/default/pods/x",
                                                "/api/v1/namespaces/default/pods/y"]


def plugin(tmp_path: Path, body: str) -> Path:
    """A credential plugin: a Python script that counts its runs in ``runs`` next to it."""
    script = tmp_path / "plugin"
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    script.chmod(0o755)
    return script


TOKEN_PLUGIN = """\
    import json, os, pathlib, sys
    runs = pathlib.Path(__file__).with_name("runs")
    n = int(runs.read_text()) + 1 if runs.exists() else 1
    runs.write_text(str(n))
    info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
    assert info["spec"]["interactive"] is False, info
    expires = os.environ.get("EXPIRES", "")
    status = {"token": f"{os.environ['PREFIX']}-{n}"}
    if expires:
        status["expirationTimestamp"] = expires
    print(json.dumps({"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}))
"""


def exec_config(tmp_path: Path, server: str, command: str, **extra: Any) -> Path:
    path = tmp_path / "config"
    path.write_text(config({"server": server}, {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": command,
        "env": [{"name": "PREFIX", "value": "tok"}], **extra}}))
    return path


async def test_exec_plugin_token_is_reused_and_renewed_after_a_401(tmp_path: Path, plain_server: Served) -> None:
    plugin(tmp_path, TOKEN_PLUGIN)
    path = exec_config(tmp_path, plain_server.url, "./plugin")  # relative to the kubeconfig, as in client-go
    await get_twice(path)
    assert [a for _, a in plain_server.seen] == ["Bearer tok-1", "Bearer tok-1"]
    plain_server.reply_401 = 1
    plain_server.seen.clear()
    await get_twice(path)
    assert [a for _, a in plain_server.seen] == ["Bearer tok-2", "Bearer tok-3", "Bearer tok-3"]


async def test_an_expired_exec_token_is_renewed(tmp_path: Path, plain_server: Served) -> None:
    plugin(tmp_path, TOKEN_PLUGIN)
    path = exec_config(tmp_path, plain_server.url, str(tmp_path / "plugin"),
                       env=[{"name": "PREFIX", "value": "old"}, {"name": "EXPIRES", "value": "2001-01-01T00:00:00Z"}])
    await get_twice(path)
    assert [a for _, a in plain_server.seen] == ["Bearer old-1", "Bearer old-2"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("import sys\nprint('please log in again', file=sys.stderr)\nsys.exit(3)\n",
         "failed with exit code 3: please log in again"),
        ("print('<html>not json</html>')\n", "did not print an ExecCredential"),
        ("import json\nprint(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1', "
         "'kind': 'ExecCredential', 'status': {'token': 't'}}))\n", "answered with apiVersion"),
        ("import json\nprint(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential', "
         "'status': {'clientCertificateData': 'x', 'clientKeyData': 'y'}}))\n", "does not take from plugins"),
    ],
    ids=["fails", "not-json", "wrong-version", "certificate-only"],
)
async def test_a_failing_exec_plugin_is_refused_before_any_request(
    tmp_path: Path, plain_server: Served, body: str, words: str
) -> None:
    plugin(tmp_path, body)
    path = exec_config(tmp_path, plain_server.url, str(tmp_path / "plugin"))
    with pytest.raises(Refused, match=words) as err:
        await get_twice(path)
    assert err.value.reason == "ExecCredential"
    assert plain_server.seen == []


def test_a_missing_exec_plugin_is_one_line_with_its_install_hint_and_exit_4(tmp_path: Path,
                                                                            plain_server: Served) -> None:
    path = exec_config(tmp_path, plain_server.url, "dispatch-test-no-such-plugin",
                       installHint="Install it with:\n  pip install something")
    result = CliRunner().invoke(app, ["--kubeconfig", str(path), "status", "x"], env={"COLUMNS": "250"})
    assert result.exit_code == EXIT_REFUSED
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2
    assert "credential plugin 'dispatch-test-no-such-plugin'" in lines[0]
    assert "was not found; its install hint: Install it with: pip install something" in lines[0]
    assert lines[1].startswith("hint: install the credential plugin")
    assert plain_server.seen == []


def test_the_cli_uses_a_kubeconfig_list(tmp_path: Path, plain_server: Served) -> None:
    """``KUBECONFIG=a:b`` once gave "does not exist"; now the merged context reaches its server."""
    plain_server.reply_404 = True
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text(yaml.safe_dump({"clusters": [{"name": "c", "cluster": {"server": plain_server.url}}],
                                     "users": [{"name": "u", "user": {"token": "from-first"}}]}))
    second.write_text(config({"server": "http://127.0.0.1:1"}, {"token": "from-second"},
                             top={"contexts": [{"name": "a", "context": {"cluster": "c", "user": "u",
                                                                          "namespace": "team"}}]}))
    result = CliRunner().invoke(app, ["status", "llama-s1"], env={
        "COLUMNS": "250", "KUBECONFIG": f"{tmp_path / 'missing'}{os.pathsep}{first}{os.pathsep}{second}"})
    assert result.exit_code == EXIT_REFUSED, result.output
    assert "trainjob llama-s1 not found in namespace team" in result.stderr
    assert plain_server.seen == [("/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/llama-s1",
                                  "Bearer from-first")]


# ---------------------------------------------------------------------- kubectl's flags and impersonation


async def get_once(path: Path | None, overrides: kc.ConfigOverrides | None = None) -> None:
    kube = k.Kube.connect(kubeconfig=path, overrides=overrides)
    try:
        await kube.get(k.PODS, "x")
    finally:
        await kube.aclose()


async def test_a_kubeconfig_users_impersonation_is_sent_as_kubectl_sends_it(tmp_path: Path,
                                                                           plain_server: Served) -> None:
    """``as``, ``as-groups``, ``as-uid`` and ``as-user-extra`` (once refused) become Impersonate-* headers."""
    path = tmp_path / "config"
    path.write_text(config({"server": plain_server.url}, {"token": "t", "as": "bob", "as-groups": ["ml", "ops"],
                                                          "as-uid": "42", "as-user-extra": {"scopes": ["view"]}}))
    await get_once(path)
    sent = plain_server.headers[-1]
    assert (sent["impersonate-user"], sent["impersonate-group"], sent["impersonate-uid"],
            sent["impersonate-extra-scopes"], sent["authorization"]) == (
        ["bob"], ["ml", "ops"], ["42"], ["view"], ["Bearer t"])


async def test_the_as_flags_replace_the_kubeconfigs_and_the_token_flag_its_credentials(
        tmp_path: Path, plain_server: Served) -> None:
    path = tmp_path / "config"
    path.write_text(config({"server": plain_server.url}, {"token": "t", "as": "bob", "as-groups": ["ml"]}))
    await get_once(path, kc.ConfigOverrides(impersonate="alice", impersonate_groups=("sre",), token="flag"))
    sent = plain_server.headers[-1]
    assert (sent["impersonate-user"], sent["impersonate-group"], sent["authorization"]) == (
        ["alice"], ["sre"], ["Bearer flag"])
    await get_once(path, kc.ConfigOverrides())
    assert "impersonate-group" in plain_server.headers[-1] and "impersonate-user" in plain_server.headers[-1]


async def test_server_cluster_and_user_flags_pick_as_kubectl_does(tmp_path: Path, plain_server: Served) -> None:
    path = tmp_path / "config"
    doc = yaml.safe_load(config({"server": "https://127.0.0.1:1"}))
    doc["clusters"].append({"name": "other", "cluster": {"server": plain_server.url}})
    doc["users"].append({"name": "ops", "user": {"token": "ops-token"}})
    path.write_text(yaml.safe_dump(doc))
    await get_once(path, kc.ConfigOverrides(cluster="other", user="ops"))
    assert plain_server.seen[-1][1] == "Bearer ops-token"
    await get_once(path, kc.ConfigOverrides(server=plain_server.url))
    assert plain_server.seen[-1][1] == "Bearer t"
    await get_once(None, kc.ConfigOverrides(server=plain_server.url, token="bare"))  # no kubeconfig at all
    assert plain_server.seen[-1][1] == "Bearer bare"
    with pytest.raises(Refused, match="--cluster names 'nope'"):
        kc.load(path, overrides=kc.ConfigOverrides(cluster="nope"))
    with pytest.raises(Refused, match="--as-group needs --as") as err:
        kc.load(path, overrides=kc.ConfigOverrides(impersonate_groups=("ml",)))
    assert err.value.reason == "BadImpersonation"


async def test_the_tls_server_name_is_what_the_certificate_is_checked_against(tmp_path: Path, pki: Path,
                                                                              tls_server: Served) -> None:
    """``tls-server-name`` (once refused) and ``--tls-server-name``: the server's certificate names
    kubernetes.default, not wrong.example; a CA from ``--certificate-authority`` replaces the kubeconfig's."""
    path = tmp_path / "config"
    client = {"client-certificate-data": b64((pki / "admin.crt").read_bytes()),
              "client-key-data": b64((pki / "admin.key").read_bytes())}
    path.write_text(config({"server": tls_server.url, "certificate-authority-data": b64(
        (pki / "ca.crt").read_bytes()), "tls-server-name": "kubernetes.default"}, client))
    await get_once(path)
    with pytest.raises(Exception, match=r"(?i)certificate|hostname|ssl"):
        await get_once(path, kc.ConfigOverrides(tls_server_name="wrong.example"))
    path.write_text(config({"server": tls_server.url, "insecure-skip-tls-verify": True}, client))
    await get_once(path, kc.ConfigOverrides(certificate_authority=str(pki / "ca.crt"),
                                            tls_server_name="kubernetes.default"))
    assert len(tls_server.seen) == 2


def test_the_systems_cas_are_read_only_when_the_kubeconfig_names_none(tmp_path: Path, pki: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the system's CA bundle is a large part of a command's start (issue 37): a kubeconfig with its own
    CA, or a plain-HTTP server, does not pay it."""
    read: list[bool] = []
    real = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        read.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counted)
    path = tmp_path / "config"
    path.write_text(config({"server": SERVER, "certificate-authority-data": b64((pki / "ca.crt").read_bytes())}))
    assert kc.load(path).verify.verify_mode == ssl.CERT_REQUIRED
    path.write_text(config({"server": "http://127.0.0.1:8080"}))
    kc.load(path)
    assert read == []
    path.write_text(config({"server": SERVER}))
    assert kc.load(path).verify.verify_mode == ssl.CERT_REQUIRED and read == [True]
