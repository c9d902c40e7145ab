"""Where the cluster is and how to authenticate: kubeconfig files (merged as kubectl merges them) or the pod's
service account.

Every way a kubeconfig can be unusable (not YAML, a list, empty, a context naming a missing cluster, certificate
data that is not base64 PEM, a credential plugin that is not installed) becomes one ``Refused`` whose message
names the file and the entry, instead of a traceback from deep inside a YAML, SSL or subprocess call.

Lookup order, as kubectl's: an explicit file (``--kubeconfig``; it must exist), else the ``KUBECONFIG`` list
(files that do not exist are skipped; the first file to define a cluster, user or context wins it, and
``current-context`` comes from the first file that sets one), else ``~/.kube/config``, else the in-cluster
service account.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import json
import os
import re
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncGenerator, Generator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import yaml

from ._overrides import ConfigOverrides as ConfigOverrides
from .errors import Refused

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
EXEC_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
_TOKEN_REREAD = 60.0
"""Seconds after which a token file is read again (client-go re-reads it each minute: tokens rotate)."""

Entry = dict[str, Any]


def _bad(message: str, reason: str = "BadKubeconfig") -> Refused:
    return Refused(message, reason=reason)


@dataclass(frozen=True)
class Connection:
    """What ``Kube.connect`` needs to build its HTTP client."""

    server: str
    verify: ssl.SSLContext
    auth: httpx2.Auth | None
    namespace: str
    proxy: str | None = None
    source: str = ""
    """Where the settings came from (``kubeconfig FILE, context NAME`` or ``in-cluster``), for messages."""
    headers: tuple[tuple[str, str], ...] = ()
    """Sent with every request: the impersonation headers (``as`` in the kubeconfig, or ``--as``)."""
    tls_server_name: str | None = None
    """The name the server's certificate is checked against (and sent as SNI), in place of the URL's host."""

    def client_options(self) -> dict[str, Any]:
        """``httpx2.AsyncClient`` keyword arguments for what this connection adds to a plain client: the
        impersonation headers, and the TLS server name set on each request."""
        options: dict[str, Any] = {}
        if self.headers:
            options["headers"] = httpx2.Headers(list(self.headers))
        if self.tls_server_name:
            name = self.tls_server_name

            async def sni(request: httpx2.Request) -> None:
                request.extensions["sni_hostname"] = name

            options["event_hooks"] = {"request": [sni]}
        return options


@dataclass
class _Named:
    """One cluster, user or context, with the file that defined it (relative paths resolve against it)."""

    body: Entry
    origin: Path


@dataclass
class _Merged:
    files: list[Path] = field(default_factory=list)
    clusters: dict[str, _Named] = field(default_factory=dict)
    users: dict[str, _Named] = field(default_factory=dict)
    contexts: dict[str, _Named] = field(default_factory=dict)
    current_context: str | None = None
    current_from: Path | None = None

    @property
    def empty(self) -> bool:
        return not (self.clusters or self.users or self.contexts)

    def describe(self) -> str:
        return "kubeconfig " + os.pathsep.join(str(f) for f in self.files)


# ------------------------------------------------------------------------------------------------ files


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line (PyYAML's own message spans several)."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    if context and problem.startswith("but "):
        problem = f"{context}, {problem}"
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def _read_file(path: Path, merged: _Merged) -> None:
    """Parse one kubeconfig and merge it into ``merged`` (earlier files keep what they defined)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise _bad(f"cannot read kubeconfig {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise _bad(f"kubeconfig {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    _read_text(text, path, merged)


_SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it (its wheels are): the same documents, about 10x faster
than the pure-Python one on a kubeconfig with certificate data (~1 ms against ~13 ms), read by every command."""


def _read_text(text: str, path: Path, merged: _Merged) -> None:
    try:
        data = yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as fast:
        problem = yaml_problem(fast)
        try:  # the pure-Python parser's account of the error: it names what it expected more plainly
            yaml.safe_load(text)
        except yaml.YAMLError as exc:
            problem = yaml_problem(exc)
        raise _bad(f"kubeconfig {path} is not valid YAML: {problem}") from None
    merged.files.append(path)
    if data is None:
        return  # an empty file is an empty config, as for kubectl
    if not isinstance(data, Mapping):
        shape = "a list" if isinstance(data, list) else f"a {type(data).__name__}"
        raise _bad(f"kubeconfig {path} is {shape}, not a mapping with clusters, users and contexts")
    for section, body_key, into in (
        ("clusters", "cluster", merged.clusters),
        ("users", "user", merged.users),
        ("contexts", "context", merged.contexts),
    ):
        entries = data.get(section)
        if entries is None:
            continue
        if not isinstance(entries, list):
            raise _bad(f"kubeconfig {path}: {section} must be a list of entries with a name and a {body_key}")
        mine: dict[str, _Named] = {}
        for i, entry in enumerate(entries):
            if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) or not entry["name"]:
                raise _bad(f"kubeconfig {path}: {section}[{i}] must be a mapping with a name")
            body = entry.get(body_key)
            if body is None:
                body = {}
            if not isinstance(body, Mapping):
                raise _bad(f"kubeconfig {path}: {section}[{entry['name']}].{body_key} must be a mapping")
            mine[entry["name"]] = _Named(dict(body), path)  # within one file the last wins, as in kubectl
        for name, named in mine.items():
            into.setdefault(name, named)
    current = data.get("current-context")
    if current is not None and not isinstance(current, str):
        raise _bad(f"kubeconfig {path}: current-context must be a string")
    if current and merged.current_context is None:
        merged.current_context, merged.current_from = current, path


def _candidates(kubeconfig: str | Path | None) -> tuple[list[Path], bool]:
    """The files to read, and whether they were asked for explicitly (then each must exist)."""
    if kubeconfig is not None:
        return [Path(kubeconfig).expanduser()], True
    env = os.environ.get("KUBECONFIG", "")
    if env:
        seen: list[Path] = []
        for part in env.split(os.pathsep):
            if part and Path(part).expanduser() not in seen:
                seen.append(Path(part).expanduser())
        return seen, False
    return [Path("~/.kube/config").expanduser()], False


def _no_config(message: str) -> Refused:
    return Refused(message, reason="NoKubeconfig")


def load(kubeconfig: str | Path | None = None, context: str | None = None,
         overrides: ConfigOverrides | None = None) -> Connection:
    """The connection settings, or a ``Refused`` naming what is wrong and where; ``overrides`` (kubectl's
    flags) are laid over what the kubeconfig says."""
    over = overrides or ConfigOverrides()
    files, explicit = _candidates(kubeconfig)
    merged = _Merged()
    if explicit:
        path = files[0]
        if not path.exists():
            listed = (f" (--kubeconfig takes one file; a {os.pathsep!r}-separated list goes in KUBECONFIG, which "
                      "is merged as kubectl merges it)") if os.pathsep in str(kubeconfig) else ""
            raise _no_config(f"kubeconfig {path} does not exist{listed}; pass --kubeconfig or set KUBECONFIG")
        if path.is_dir():
            raise _bad(f"kubeconfig {path} is a directory, not a file")
        _read_file(path, merged)
    else:
        for path in files:
            if path.is_file():
                _read_file(path, merged)
            elif path.exists():
                raise _bad(f"kubeconfig {path} (in KUBECONFIG) is not a file")
    if not merged.files:
        if over.server and context is None:
            return _select(_flags_only(over), None, over)  # kubectl --server with no kubeconfig
        if context is None and _in_cluster_possible():
            return _in_cluster(over)
        where = ("none of the files in KUBECONFIG exists (" + ", ".join(str(f) for f in files) + ")"
                 if os.environ.get("KUBECONFIG") else f"{files[0]} does not exist")
        raise _no_config(f"no kubeconfig found: {where}; pass --kubeconfig or set KUBECONFIG")
    if merged.empty:
        if over.server and context is None:
            return _select(_flags_only(over), None, over)
        if context is None and not explicit and _in_cluster_possible():
            return _in_cluster(over)
        raise _bad(f"{merged.describe()} is empty: it defines no clusters, users or contexts")
    return _select(merged, context, over)


def _flags_only(over: ConfigOverrides) -> _Merged:
    """The kubeconfig kubectl makes of ``--server`` (and the other flags) when no file exists."""
    origin = Path.cwd() / "(command-line flags)"
    merged = _Merged(files=[origin], current_context="flags", current_from=origin)
    merged.clusters["flags"] = _Named({"server": over.server}, origin)
    merged.users["flags"] = _Named({}, origin)
    merged.contexts["flags"] = _Named({"cluster": "flags", "user": "flags"}, origin)
    return merged


def entry_names(kubeconfig: str | Path | None = None) -> dict[str, list[str]]:
    """The names of the contexts, clusters and users the kubeconfig defines (merged as ``load`` merges
    them), for completion; an unreadable kubeconfig defines none."""
    files, _ = _candidates(kubeconfig)
    merged = _Merged()
    for path in files:
        try:
            if path.is_file():
                _read_file(path, merged)
        except Refused:
            continue
    return {"contexts": sorted(merged.contexts), "clusters": sorted(merged.clusters), "users": sorted(merged.users)}


INLINE_LIMIT = 1 << 20
"""A kubeconfig held in a Secret is at most a Secret's size."""
_FILE_OR_PROGRAM = {"clusters": ("certificate-authority",), "users": (
    "client-certificate", "client-key", "tokenFile", "exec", "auth-provider")}


def load_inline(text: str, source: str) -> Connection:
    """The connection a kubeconfig held in the cluster (a MultiKueue worker's Secret) describes.

    Only inline credentials (``*-data``, ``token``) are accepted: a file path names a file of the reader's
    own machine, and an exec plugin would run a program inside dispatch's controller chosen by whoever can
    write that Secret. Kueue refuses both by default for the same reason."""
    if len(text) > INLINE_LIMIT:
        raise _bad(f"{source} holds {len(text)} characters, more than a Secret can (a kubeconfig is a few KB)")
    merged = _Merged()
    origin = Path(source)
    _read_text(text, origin, merged)
    for section, keys in _FILE_OR_PROGRAM.items():
        entries = merged.clusters if section == "clusters" else merged.users
        for name, named in entries.items():
            for key in keys:
                if named.body.get(key):
                    raise _bad(f"{source}: {section}[{name}] sets {key}, which names a file or a program of the "
                               "reader's machine; a kubeconfig held in a Secret must carry its credentials inline "
                               "(certificate-authority-data, client-certificate-data and client-key-data, or token)")
    if merged.empty:
        raise _bad(f"{source} is empty: it defines no clusters, users or contexts")
    return _select(merged, None)


# ------------------------------------------------------------------------------------------ selection


def _str(body: Entry, key: str, where: str, *, required: bool = False) -> str | None:
    value = body.get(key)
    if value is None or value == "":
        if required:
            raise _bad(f"{where}.{key} is missing")
        return None
    if not isinstance(value, str):
        raise _bad(f"{where}.{key} must be a string (got {type(value).__name__} {value!r})")
    return value


def _resolve(path: str, origin: Path) -> Path:
    """A path in a kubeconfig is relative to the file that holds it."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else (origin.parent / p).resolve()


def _select(merged: _Merged, context: str | None, over: ConfigOverrides | None = None) -> Connection:
    over = over or ConfigOverrides()
    src = merged.describe()
    name = context or merged.current_context
    if not name:
        names = ", ".join(sorted(merged.contexts)) or "none"
        raise Refused(f"{src} sets no current-context; pass --context (contexts: {names})", reason="NoContext")
    ctx = merged.contexts.get(name)
    if ctx is None:
        names = ", ".join(sorted(merged.contexts)) or "none"
        raise Refused(f"context {name!r} not found in {src} (contexts: {names})", reason="NoContext")
    cwhere = f"kubeconfig {ctx.origin}: contexts[{name}].context"
    cluster_name = over.cluster or _str(ctx.body, "cluster", cwhere, required=True)
    assert cluster_name is not None
    user_name = over.user or _str(ctx.body, "user", cwhere)
    namespace = _str(ctx.body, "namespace", cwhere) or "default"
    cluster = merged.clusters.get(cluster_name)
    if cluster is None:
        if over.cluster:
            raise _bad(f"--cluster names {cluster_name!r}, which {src} does not define (clusters: "
                       f"{', '.join(sorted(merged.clusters)) or 'none'})")
        raise _bad(f"{cwhere}.cluster names {cluster_name!r}, which {src} does not define")
    user: _Named | None = None
    if user_name is not None:
        user = merged.users.get(user_name)
        if user is None:
            if over.user:
                raise _bad(f"--user names {user_name!r}, which {src} does not define (users: "
                           f"{', '.join(sorted(merged.users)) or 'none'})")
            raise _bad(f"{cwhere}.user names {user_name!r}, which {src} does not define")
    kwhere = f"kubeconfig {cluster.origin}: clusters[{cluster_name}].cluster"
    uwhere = f"kubeconfig {user.origin}: users[{user_name}].user" if user is not None else ""
    cluster = _over_cluster(cluster, over)
    if over.token is not None:
        user = _Named({**{k: v for k, v in (user.body if user else {}).items() if k not in _AUTH_KEYS},
                       "token": over.token}, user.origin if user else cluster.origin)
        uwhere = uwhere or "--token"
    verify, has_tls = _ssl_context(cluster, user, kwhere, uwhere)
    server = _server(cluster.body, kwhere, default_tls=has_tls)
    proxy = _str(cluster.body, "proxy-url", kwhere)
    if proxy is not None and urlsplit(proxy).scheme not in ("http", "https"):
        raise _bad(f"{kwhere}.proxy-url {proxy!r}: dispatch supports http and https proxies only")
    auth = _auth(user, uwhere, cluster, server) if user is not None else None
    headers = _impersonation(user.body if user is not None else {}, uwhere, over)
    tls_server_name = _str(cluster.body, "tls-server-name", kwhere)
    return Connection(server, verify, auth, namespace, proxy, f"{src}, context {name}", headers, tls_server_name)


_AUTH_KEYS = ("token", "tokenFile", "exec", "auth-provider", "username", "password")
"""What authenticates a user apart from a client certificate: all of it gives way to ``--token``."""


def _over_cluster(cluster: _Named, over: ConfigOverrides) -> _Named:
    """The cluster entry with kubectl's flags laid over it, as client-go's ``getCluster`` lays them."""
    body = dict(cluster.body)
    if over.server:
        body["server"] = over.server
    if over.insecure_skip_tls_verify or over.certificate_authority:
        # a CA or a skip from the command line replaces both, or the kubeconfig's CA would win or clash
        body.pop("certificate-authority-data", None)
        body["insecure-skip-tls-verify"] = over.insecure_skip_tls_verify
        body["certificate-authority"] = (str(Path(over.certificate_authority).expanduser().resolve())
                                         if over.certificate_authority else None)
    if over.tls_server_name or over.server:
        body["tls-server-name"] = over.tls_server_name  # --server without it drops the kubeconfig's, as kubectl
    return _Named(body, cluster.origin)


def _impersonation(user: Entry, where: str, over: ConfigOverrides) -> tuple[tuple[str, str], ...]:
    """The Impersonate-* headers: from the flags if ``--as`` is given, else from the kubeconfig user's
    ``as``, ``as-groups``, ``as-uid`` and ``as-user-extra`` (what kubectl sends for each)."""
    if over.impersonate or over.impersonate_groups or over.impersonate_uid:
        if not over.impersonate:
            given = "--as-group" if over.impersonate_groups else "--as-uid"
            raise _bad(f"{given} needs --as: groups and a uid are impersonated only with a user (as kubectl "
                       "requires)", "BadImpersonation")
        return (("Impersonate-User", over.impersonate),
                *(("Impersonate-Group", g) for g in over.impersonate_groups),
                *((("Impersonate-Uid", over.impersonate_uid),) if over.impersonate_uid else ()))
    name = _str(user, "as", where)
    uid = _str(user, "as-uid", where)
    groups = user.get("as-groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise _bad(f"{where}.as-groups must be a list of strings")
    extra = user.get("as-user-extra") or {}
    if not isinstance(extra, Mapping) or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(x, str) for x in v)
            for k, v in extra.items()):
        raise _bad(f"{where}.as-user-extra must map names to lists of strings")
    if name is None:
        if groups or uid or extra:
            raise _bad(f"{where} sets as-groups, as-uid or as-user-extra without as: groups, a uid and extra "
                       "fields are impersonated only with a user", "BadImpersonation")
        return ()
    return (("Impersonate-User", name), *(("Impersonate-Group", g) for g in groups),
            *((("Impersonate-Uid", uid),) if uid else ()),
            *((f"Impersonate-Extra-{_extra_key(k)}", v) for k, values in extra.items() for v in values))


def _extra_key(key: str) -> str:
    """An extra field's name as a header name: percent-encoded where a header name cannot hold it (as
    client-go encodes it)."""
    from urllib.parse import quote

    return quote(key, safe="!#$&'*+-.^_`|~")


_BARE_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(:[0-9]+)?$")
"""A bare ``host[:port]`` (no scheme), which client-go's DefaultServerURL completes with a scheme."""
_HOST_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?$")


def _server(body: Entry, where: str, *, default_tls: bool) -> str:
    """The API server's URL, or a refusal naming the entry.

    A URL that cannot reach any server (no host, a bad port, a space) is the kubeconfig's fault: refused
    here, so it reads as bad input (exit 4) rather than as a server that is down (exit 3, retry forever).
    """
    server = _str(body, "server", where, required=True)
    assert server is not None

    def bad(why: str) -> Refused:
        return _bad(f"{where}.server {server!r} {why}; write it as https://HOST[:PORT][/PATH]")

    if "://" not in server and _BARE_HOST.match(server):
        # client-go's DefaultServerURL: a bare host[:port] gets https when TLS is configured, else http
        server = ("https://" if default_tls else "http://") + server
    elif "://" not in server:
        raise bad("has no scheme and is not a bare host[:port]")
    try:
        parts = urlsplit(server)
        port = parts.port
    except ValueError as exc:
        raise bad(f"is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise _bad(f"{where}.server {server!r} is not an http(s) URL of the API server")
    host = parts.hostname or ""
    if not host:
        raise bad("has no host")
    if any(c.isspace() or not c.isprintable() for c in server):
        raise bad("contains a space or control character")
    if not _HOST_NAME.match(host):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise bad(f"has a host {host!r} that is not a DNS name or IP address") from None
    if port == 0:
        raise bad("has port 0")
    return server


# ----------------------------------------------------------------------------------------- certificates


def _b64(value: str, where: str) -> bytes:
    try:
        return base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        raise _bad(f"{where} is not valid base64", "BadCertificate") from None


def _file_bytes(path: Path, where: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _bad(f"{where} {path}: {exc.strerror or exc}", "BadCertificate") from None


def _pem_or_der(data: bytes) -> str | bytes:
    text = data.decode("ascii", "replace")
    return text if "-----BEGIN" in text else data


def _ssl_context(cluster: _Named, user: _Named | None, kwhere: str, uwhere: str) -> tuple[ssl.SSLContext, bool]:
    body = cluster.body
    insecure = body.get("insecure-skip-tls-verify", False)
    if not isinstance(insecure, bool):
        raise _bad(f"{kwhere}.insecure-skip-tls-verify must be true or false (got {insecure!r})")
    ca: bytes | None = None
    ca_where = ""
    if (data := _str(body, "certificate-authority-data", kwhere)) is not None:
        ca_where = f"{kwhere}.certificate-authority-data"
        ca = _b64(data, ca_where)
    elif (path := _str(body, "certificate-authority", kwhere)) is not None:
        ca_where = f"{kwhere}.certificate-authority"
        ca = _file_bytes(_resolve(path, cluster.origin), ca_where)
    if ca is not None and insecure:
        raise _bad(f"{kwhere} sets both a certificate authority and insecure-skip-tls-verify; kubectl refuses "
                   "that too: keep one")
    if ca is None and str(body.get("server", "")).startswith("http://"):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # a plain-HTTP server: no certificate is ever checked
    elif ca is None:
        ctx = ssl.create_default_context()  # the system's CAs: reading them costs ~10-100 ms, so only here
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            ctx.load_verify_locations(cadata=_pem_or_der(ca))
        except (ssl.SSLError, ValueError) as exc:
            raise _bad(f"{ca_where} is not a PEM certificate ({_ssl_words(exc)})", "BadCertificate") from None
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    has_cert = False
    if user is not None:
        has_cert = _client_cert(ctx, user, uwhere)
    return ctx, ca is not None or insecure or has_cert


def _ssl_words(exc: Exception) -> str:
    return str(getattr(exc, "reason", None) or exc).replace("_", " ").lower()


def _client_cert(ctx: ssl.SSLContext, user: _Named, where: str) -> bool:
    parts: dict[str, bytes] = {}
    for kind in ("certificate", "key"):
        data = _str(user.body, f"client-{kind}-data", where)
        path = _str(user.body, f"client-{kind}", where)
        if data is not None:
            parts[kind] = _b64(data, f"{where}.client-{kind}-data")
        elif path is not None:
            parts[kind] = _file_bytes(_resolve(path, user.origin), f"{where}.client-{kind}")
    if not parts:
        return False
    if len(parts) == 1:
        have = next(iter(parts))
        missing = "key" if have == "certificate" else "certificate"
        raise _bad(f"{where} has a client {have} but no client {missing} (client-{missing}-data or "
                   f"client-{missing})", "BadCertificate")
    # the ssl module loads a certificate chain from files only: a private directory, gone once loaded
    with tempfile.TemporaryDirectory(prefix="dispatch-") as tmp:
        cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        for target, content in ((cert, parts["certificate"]), (key, parts["key"])):
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(content)
        try:
            ctx.load_cert_chain(cert, key)
        except (ssl.SSLError, ValueError) as exc:
            raise _bad(f"{where}: the client certificate and key cannot be used ({_ssl_words(exc)}); they must "
                       "be a PEM certificate and its PEM private key", "BadCertificate") from None
    return True


# -------------------------------------------------------------------------------------------------- auth


def _auth(user: _Named, where: str, cluster: _Named, server: str) -> httpx2.Auth | None:
    body = user.body
    if body.get("auth-provider"):
        provider = body["auth-provider"].get("name", "?") if isinstance(body["auth-provider"], Mapping) else "?"
        raise _bad(f"{where}.auth-provider ({provider}) is not supported (kubectl dropped auth providers too); "
                   "use an exec credential plugin such as kubelogin or gke-gcloud-auth-plugin", "ExecCredential")
    if (token_file := _str(body, "tokenFile", where)) is not None:
        path = _resolve(token_file, user.origin)
        if not path.is_file():
            raise _bad(f"{where}.tokenFile {path} does not exist")
        return TokenFileAuth(path)
    if (token := _str(body, "token", where)) is not None:
        return BearerAuth(token)
    if body.get("exec") is not None:
        return ExecAuth.from_kubeconfig(body["exec"], f"{where}.exec", user.origin, cluster, server)
    username, password = _str(body, "username", where), _str(body, "password", where)
    if username is not None and password is not None:
        return httpx2.BasicAuth(username, password)
    return None


class BearerAuth(httpx2.Auth):
    """A fixed bearer token."""

    def __init__(self, token: str) -> None:
        self._header = f"Bearer {token.strip()}"

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        request.headers["Authorization"] = self._header
        yield request


class TokenFileAuth(httpx2.Auth):
    """A bearer token read from a file, read again each minute and after a 401 (service-account tokens rotate)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._header = ""
        self._read_at = 0.0

    def _read(self) -> str:
        try:
            token = self._path.read_text().strip()
        except OSError as exc:
            raise _bad(f"token file {self._path}: {exc.strerror or exc}") from None
        self._header, self._read_at = f"Bearer {token}", time.monotonic()
        return self._header

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        if not self._header or time.monotonic() - self._read_at > _TOKEN_REREAD:
            self._read()
        request.headers["Authorization"] = self._header
        response = yield request
        if response.status_code == 401:
            request.headers["Authorization"] = self._read()
            yield request


STDERR_LINES = 50
STDERR_WIDTH = 500


class ExecAuth(httpx2.Auth):
    """A client-go credential plugin (``users[].user.exec``): run it for a token, reuse the token until it
    expires or the API server answers 401.

    A plugin that is not installed, fails or prints something other than an ExecCredential raises
    ``Refused(reason="ExecCredential")`` naming the plugin, before the request is sent.
    """

    def __init__(self, argv: list[str], env: dict[str, str], api_version: str, where: str,
                 install_hint: str | None = None, exec_info: Entry | None = None) -> None:
        self.argv = argv
        self.env = env
        self.api_version = api_version
        self.where = where
        self.install_hint = install_hint
        self.exec_info = exec_info or {}
        self._header = ""
        self._expires: datetime | None = None
        self._lock = threading.Lock()
        self._alock: asyncio.Lock | None = None

    @classmethod
    def from_kubeconfig(cls, body: object, where: str, origin: Path, cluster: _Named, server: str) -> ExecAuth:
        if not isinstance(body, Mapping):
            raise _bad(f"{where} must be a mapping with apiVersion and command")
        api_version = _str(dict(body), "apiVersion", where, required=True)
        if api_version not in EXEC_VERSIONS:
            raise _bad(f"{where}.apiVersion {api_version!r} is not supported (use one of {', '.join(EXEC_VERSIONS)})",
                       "ExecCredential")
        command = _str(dict(body), "command", where, required=True)
        assert command is not None and api_version is not None
        if os.sep in command and not Path(command).is_absolute():
            command = str(_resolve(command, origin))  # as client-go: only a path with a separator is relative
        args = body.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise _bad(f"{where}.args must be a list of strings")
        env: dict[str, str] = {}
        for i, item in enumerate(body.get("env") or []):
            if not (isinstance(item, Mapping) and isinstance(item.get("name"), str)
                    and isinstance(item.get("value"), str)):
                raise _bad(f"{where}.env[{i}] must be a mapping with a string name and value")
            env[item["name"]] = item["value"]
        hint = body.get("installHint")
        spec: Entry = {"interactive": False}
        if body.get("provideClusterInfo") is True:
            spec["cluster"] = {"server": server, **({"certificate-authority-data": cluster.body[
                "certificate-authority-data"]} if cluster.body.get("certificate-authority-data") else {})}
        info = {"apiVersion": api_version, "kind": "ExecCredential", "spec": spec}
        return cls([command, *args], env, api_version, where, hint if isinstance(hint, str) else None, info)

    # -- running the plugin

    def _environment(self) -> dict[str, str]:
        return {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(self.exec_info)}

    def _not_found(self) -> Refused:
        hint = " ".join((self.install_hint or "").split())
        return _bad(f"credential plugin {self.argv[0]!r} ({self.where}.command) was not found"
                    + (f"; its install hint: {hint}" if hint else ""), "ExecCredential")

    def _failed(self, code: int, stderr: bytes) -> Refused:
        """The plugin's whole stderr, as kubectl shows it: a login plugin's advice is rarely on its last line.
        Bounded (the last ``STDERR_LINES`` lines, each cut at ``STDERR_WIDTH``), control characters shown as
        spaces so a terminal escape in it cannot rewrite the screen."""
        text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", " ", stderr.decode(errors="replace"))
        lines = [line.rstrip()[:STDERR_WIDTH] for line in text.splitlines() if line.strip()]
        if len(lines) > STDERR_LINES:
            lines = [f"({len(lines) - STDERR_LINES} earlier lines left out)", *lines[-STDERR_LINES:]]
        said = (f": {lines[0].strip()}" if len(lines) == 1
                else ("; its stderr:\n" + "\n".join(f"  {line}" for line in lines)) if lines else "")
        return _bad(f"credential plugin {self.argv[0]!r} ({self.where}) failed with exit code {code}{said}",
                    "ExecCredential")

    def _accept(self, stdout: bytes) -> str:
        """The ``Authorization`` header from the plugin's ExecCredential."""
        try:
            cred = json.loads(stdout)
        except ValueError:
            cred = None
        status = cred.get("status") if isinstance(cred, Mapping) else None
        if not isinstance(cred, Mapping) or cred.get("kind") != "ExecCredential" or not isinstance(status, Mapping):
            raise _bad(f"credential plugin {self.argv[0]!r} ({self.where}) did not print an ExecCredential "
                       "(JSON with kind ExecCredential and a status)", "ExecCredential")
        if cred.get("apiVersion") != self.api_version:
            raise _bad(f"credential plugin {self.argv[0]!r} answered with apiVersion {cred.get('apiVersion')!r}, "
                       f"but {self.where}.apiVersion asks for {self.api_version}", "ExecCredential")
        token = status.get("token")
        if not isinstance(token, str) or not token:
            more = (" (it returned a client certificate, which dispatch does not take from plugins)"
                    if status.get("clientCertificateData") else "")
            raise _bad(f"credential plugin {self.argv[0]!r} ({self.where}) returned no token{more}", "ExecCredential")
        expires = status.get("expirationTimestamp")
        self._expires = None
        if isinstance(expires, str) and expires:
            try:
                self._expires = datetime.fromisoformat(expires.replace("Z", "+00:00"))
            except ValueError:
                raise _bad(f"credential plugin {self.argv[0]!r} returned an expirationTimestamp that is not a "
                           f"time: {expires!r}", "ExecCredential") from None
        self._header = f"Bearer {token}"
        return self._header

    def _fresh(self) -> bool:
        if not self._header:
            return False
        return self._expires is None or self._expires > datetime.now(UTC)

    def _run_sync(self) -> str:
        try:
            proc = subprocess.run(self.argv, env=self._environment(), capture_output=True, stdin=subprocess.DEVNULL,
                                  check=False)
        except FileNotFoundError:
            raise self._not_found() from None
        except OSError as exc:
            raise _bad(f"credential plugin {self.argv[0]!r} cannot be run: {exc.strerror or exc}",
                       "ExecCredential") from None
        if proc.returncode != 0:
            raise self._failed(proc.returncode, proc.stderr)
        return self._accept(proc.stdout)

    async def _run_async(self) -> str:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv, env=self._environment(), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
        except FileNotFoundError:
            raise self._not_found() from None
        except OSError as exc:
            raise _bad(f"credential plugin {self.argv[0]!r} cannot be run: {exc.strerror or exc}",
                       "ExecCredential") from None
        stdout, stderr = await proc.communicate()
        if proc.returncode != 0:
            raise self._failed(proc.returncode or 0, stderr)
        return self._accept(stdout)

    # -- httpx flows

    def sync_auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        with self._lock:
            header = self._header if self._fresh() else self._run_sync()
        request.headers["Authorization"] = header
        response = yield request
        if response.status_code == 401:
            with self._lock:
                request.headers["Authorization"] = self._run_sync()
            yield request

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        if self._alock is None:
            self._alock = asyncio.Lock()
        async with self._alock:  # many concurrent first requests run the plugin once
            header = self._header if self._fresh() else await self._run_async()
        request.headers["Authorization"] = header
        response = yield request
        if response.status_code == 401:
            async with self._alock:
                request.headers["Authorization"] = await self._run_async()
            yield request


# ------------------------------------------------------------------------------------------- in-cluster


def _in_cluster_possible() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (SERVICE_ACCOUNT / "token").is_file()


def _in_cluster(over: ConfigOverrides | None = None) -> Connection:
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:
        host = f"[{host}]"
    where = f"the service account in {SERVICE_ACCOUNT}"
    ca = _file_bytes(SERVICE_ACCOUNT / "ca.crt", f"{where}: ca.crt")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        ctx.load_verify_locations(cadata=_pem_or_der(ca))
    except (ssl.SSLError, ValueError) as exc:
        raise _bad(f"{where}: ca.crt is not a PEM certificate ({_ssl_words(exc)})", "BadCertificate") from None
    try:
        namespace = (SERVICE_ACCOUNT / "namespace").read_text().strip() or "default"
    except OSError:
        namespace = "default"
    auth: httpx2.Auth = TokenFileAuth(SERVICE_ACCOUNT / "token")
    if over is not None and over.token is not None:
        auth = BearerAuth(over.token)
    return Connection(f"https://{host}:{port}", ctx, auth, namespace, source="in-cluster service account",
                      headers=_impersonation({}, "in-cluster", over) if over is not None else ())
