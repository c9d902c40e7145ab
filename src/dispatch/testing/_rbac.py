"""RBAC for the fake API server, read from the roles dispatch ships (``deploy/base/rbac.yaml``).

A test that runs the library or the controller through a role-bound transport gets exactly the answers
a real cluster with those roles would give: each HTTP request is turned into the authorization
attributes the real API server derives from it (verb, API group, resource, subresource, namespace,
name), matched against the rules the way Kubernetes' RBAC authorizer matches them, and a denial is the
real 403 Status. Without this, a missing verb in the shipped roles is found only on a real cluster.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .._api import Obj

SHIPPED_RBAC = Path(__file__).resolve().parent / "shipped" / "rbac.yaml"
"""The roles dispatch ships (``deploy/base/rbac.yaml``), inside the package, so that an installed
``dispatch.testing`` runs with them too; ``tests/unit/test_shipped_data.py`` holds the copy equal to deploy/."""

RBAC_GROUP = "rbac.authorization.k8s.io"

# Path segments the real server's request parser treats specially (k8s.io/apiserver, requestinfo.go).
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_VERBS_BY_METHOD = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
                    "DELETE": "delete"}
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})


class RbacError(ValueError):
    """The RBAC manifest, or a role or binding asked for, is not usable."""


@dataclass(frozen=True)
class Attributes:
    """What the authorizer decides on: the real API server's view of one request."""

    verb: str
    path: str
    resource_request: bool
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def combined_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def request_attributes(method: str, path: str, params: Mapping[str, str]) -> Attributes:
    """Derive the authorization attributes of a request as kube-apiserver does (method, path, query)."""
    method = method.upper()
    parts = [p for p in path.strip("/").split("/") if p]
    verb_of_method = _VERBS_BY_METHOD.get(method, method.lower())
    if len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    elif len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    else:
        rest = []
        group = version = ""
    if not rest:
        # discovery (/api, /apis/g/v) and everything outside /api, /apis: a non-resource request
        return Attributes(verb=method.lower(), path=path, resource_request=False)
    verb = verb_of_method
    if rest[0] == "watch":  # the deprecated /watch/ path prefix
        verb, rest = "watch", rest[1:]
        if not rest:
            return Attributes(verb=method.lower(), path=path, resource_request=False)
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if not name and verb == "get":
        verb = "watch" if params.get("watch", "") in _TRUE else "list"
        for term in (params.get("fieldSelector") or "").split(","):
            key, sep, value = term.partition("=")
            if sep and key.strip() == "metadata.name" and not value.startswith("="):
                name = value.strip()
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(verb=verb, path=path, resource_request=True, group=group, version=version,
                      resource=resource, subresource=subresource, namespace=namespace, name=name)


@dataclass(frozen=True)
class Rule:
    """One PolicyRule."""

    verbs: frozenset[str]
    api_groups: frozenset[str] = frozenset()
    resources: frozenset[str] = frozenset()
    resource_names: frozenset[str] = frozenset()
    non_resource_urls: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, raw: Any, where: str) -> Rule:
        if not isinstance(raw, dict):
            raise RbacError(f"{where}: a rule must be a mapping, got {raw!r}")

        def strings(key: str) -> frozenset[str]:
            value = raw.get(key) or []
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise RbacError(f"{where}: {key} must be a list of strings, got {value!r}")
            return frozenset(value)

        unknown = set(raw) - {"verbs", "apiGroups", "resources", "resourceNames", "nonResourceURLs"}
        if unknown:
            raise RbacError(f"{where}: unknown rule fields {sorted(unknown)}")
        rule = cls(strings("verbs"), strings("apiGroups"), strings("resources"), strings("resourceNames"),
                   strings("nonResourceURLs"))
        if not rule.verbs:
            raise RbacError(f"{where}: a rule needs verbs")
        if rule.non_resource_urls and (rule.resources or rule.api_groups):
            raise RbacError(f"{where}: nonResourceURLs cannot be mixed with apiGroups/resources")
        return rule

    def allows(self, a: Attributes) -> bool:
        if "*" not in self.verbs and a.verb not in self.verbs:
            return False
        if not a.resource_request:
            return any(u == "*" or u == a.path or (u.endswith("*") and a.path.startswith(u[:-1]))
                       for u in self.non_resource_urls)
        if "*" not in self.api_groups and a.group not in self.api_groups:
            return False
        if not self._resource_matches(a):
            return False
        return not self.resource_names or a.name in self.resource_names

    def _resource_matches(self, a: Attributes) -> bool:
        combined = a.combined_resource
        for r in self.resources:
            if r == "*" or r == combined:
                return True
            if a.subresource and r == f"*/{a.subresource}":
                return True
        return False


@dataclass(frozen=True)
class Binding:
    """A role granted to the transport's user: a ClusterRole cluster-wide (``namespace=None``, as a
    ClusterRoleBinding) or in one namespace (as a RoleBinding), or a namespaced Role in its namespace."""

    role: str
    namespace: str | None = None
    kind: str = "ClusterRole"


@dataclass
class Policy:
    """The roles and bindings of an RBAC manifest."""

    cluster_roles: dict[str, tuple[Rule, ...]] = field(default_factory=dict)
    roles: dict[tuple[str, str], tuple[Rule, ...]] = field(default_factory=dict)
    bindings: list[tuple[str, Binding]] = field(default_factory=list)
    """(user the binding's subject authenticates as, what it grants), as shipped."""

    @classmethod
    def load(cls, source: str | Path | None = None) -> Policy:
        """Parse a manifest: a path, YAML text, or (None) the shipped roles (``deploy/base/rbac.yaml``)."""
        if source is None:
            if not SHIPPED_RBAC.is_file():
                raise RbacError(f"the shipped roles are not at {SHIPPED_RBAC} (the package is incomplete): "
                                "reinstall trainjob-dispatch, or pass the manifest's path or text as rbac=")
            source = SHIPPED_RBAC
        text = source.read_text() if isinstance(source, Path) else source
        try:
            docs = [d for d in yaml.safe_load_all(text) if d]
        except yaml.YAMLError as exc:
            raise RbacError(f"the RBAC manifest is not YAML: {exc}") from exc
        return cls.from_documents(docs)

    @classmethod
    def from_documents(cls, docs: Iterable[Any]) -> Policy:
        policy = cls()
        for doc in docs:
            if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict):
                raise RbacError(f"not a Kubernetes object: {doc!r:.80}")
            kind, meta = doc.get("kind"), doc["metadata"]
            name = meta.get("name")
            if not isinstance(name, str) or not name:
                raise RbacError(f"a {kind} without metadata.name")
            where = f"{kind} {name}"
            if kind in ("ClusterRole", "Role"):
                if doc.get("aggregationRule"):
                    raise RbacError(f"{where}: aggregated roles are not supported by the fake")
                rules = tuple(Rule.parse(r, f"{where} rule {i}") for i, r in enumerate(doc.get("rules") or []))
                if kind == "ClusterRole":
                    policy.cluster_roles[name] = rules
                else:
                    if any(r.non_resource_urls for r in rules):
                        raise RbacError(f"{where}: a Role cannot grant nonResourceURLs")
                    policy.roles[(meta.get("namespace") or "default", name)] = rules
            elif kind in ("ClusterRoleBinding", "RoleBinding"):
                ref = doc.get("roleRef") or {}
                if ref.get("apiGroup") != RBAC_GROUP or ref.get("kind") not in ("ClusterRole", "Role"):
                    raise RbacError(f"{where}: roleRef must name a ClusterRole or Role of {RBAC_GROUP}")
                if kind == "ClusterRoleBinding" and ref["kind"] == "Role":
                    raise RbacError(f"{where}: a ClusterRoleBinding cannot bind a Role")
                ns = None if kind == "ClusterRoleBinding" else (meta.get("namespace") or "default")
                for subject in doc.get("subjects") or []:
                    policy.bindings.append((_subject_user(subject, ns, where),
                                            Binding(str(ref.get("name")), ns, str(ref["kind"]))))
        return policy

    def rules_of(self, binding: Binding) -> tuple[Rule, ...]:
        if binding.kind == "Role":
            if binding.namespace is None:
                raise RbacError(f"Role {binding.role} needs a namespace")
            try:
                return self.roles[(binding.namespace, binding.role)]
            except KeyError:
                raise RbacError(f"no Role {binding.role} in namespace {binding.namespace} in the manifest; "
                                f"Roles: {sorted(f'{ns}/{n}' for ns, n in self.roles)}") from None
        try:
            return self.cluster_roles[binding.role]
        except KeyError:
            raise RbacError(f"no ClusterRole {binding.role} in the manifest; ClusterRoles: "
                            f"{sorted(self.cluster_roles)}") from None

    def identity(self, roles: Iterable[str | Binding], *, user: str | None = None) -> Identity:
        """The user a transport acts as, holding ``roles``.

        A role name the manifest binds to a subject (the controller's ServiceAccount) brings that
        subject's user name and every binding the manifest gives it (its Lease Role too). Any other
        role name is granted cluster-wide; pass a ``Binding`` to grant it in one namespace, as a
        RoleBinding would.
        """
        bindings: list[Binding] = []
        users: list[str] = []
        for item in roles:
            if isinstance(item, Binding):
                self.rules_of(item)
                bindings.append(item)
                continue
            if not isinstance(item, str):
                raise RbacError(f"a role is a name or a Binding, got {item!r}")
            self.rules_of(Binding(item))
            shipped = [(u, b) for u, b in self.bindings if b.kind == "ClusterRole" and b.role == item
                       and b.namespace is None]
            if shipped:
                subject = shipped[0][0]
                users.append(subject)
                bindings.extend(b for u, b in self.bindings if u == subject)
            else:
                bindings.append(Binding(item))
        if not bindings:
            raise RbacError("no role given")
        chosen = user or (users[0] if users else "system:serviceaccount:default:dispatch-test")
        return Identity(chosen, tuple(dict.fromkeys(bindings)), self)


@functools.cache
def shipped_policy() -> Policy:
    """The shipped roles, parsed once per test run (the manifest does not change under a test)."""
    return Policy.load()


def _subject_user(subject: Any, binding_ns: str | None, where: str) -> str:
    if not isinstance(subject, dict):
        raise RbacError(f"{where}: a subject must be a mapping")
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_ns
        if not ns:
            raise RbacError(f"{where}: a ServiceAccount subject needs a namespace")
        return f"system:serviceaccount:{ns}:{name}"
    if kind in ("User", "Group"):
        return f"{'group:' if kind == 'Group' else ''}{name}"
    raise RbacError(f"{where}: unknown subject kind {kind!r}")


_DISCOVERY = ("/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz",
              "/version", "/version/")
DEFAULT_RULES: tuple[Rule, ...] = (
    Rule(frozenset({"get"}), non_resource_urls=frozenset(_DISCOVERY)),  # system:discovery, public-info-viewer
    Rule(frozenset({"create"}), frozenset({"authorization.k8s.io"}),  # system:basic-user
         frozenset({"selfsubjectaccessreviews", "selfsubjectrulesreviews"})),
    Rule(frozenset({"create"}), frozenset({"authentication.k8s.io"}), frozenset({"selfsubjectreviews"})),
)
"""What the API server's bootstrap roles grant every authenticated user, whatever dispatch's roles say."""


@dataclass(frozen=True)
class Identity:
    """A user and the roles bound to it: decides each request as the RBAC authorizer would."""

    user: str
    bindings: tuple[Binding, ...]
    policy: Policy = field(repr=False)

    def allows(self, a: Attributes) -> bool:
        if any(rule.allows(a) for rule in DEFAULT_RULES):
            return True
        for b in self.bindings:
            if b.namespace is not None and (not a.resource_request or a.namespace != b.namespace):
                continue  # a RoleBinding grants only inside its namespace, never cluster-scoped requests
            if any(rule.allows(a) for rule in self.policy.rules_of(b)):
                return True
        return False

    def authorize(self, method: str, path: str, params: Mapping[str, str], content_type: str = "",
                  exists: Callable[[Attributes], bool] | None = None) -> None:
        """Raise the real 403 if the request is denied.

        A server-side apply that would create the object also needs ``create`` (kube-apiserver's patch
        handler checks it once it finds the object missing); ``exists`` answers that.
        """
        a = request_attributes(method, path, params)
        if not self.allows(a):
            raise forbidden(self.user, a)
        if (a.verb == "patch" and content_type.startswith("application/apply-patch") and exists is not None
                and not exists(a)):
            create = Attributes("create", a.path, True, a.group, a.version, a.resource, a.subresource,
                                a.namespace, a.name)
            if not self.allows(create):
                raise forbidden(self.user, create)


class Forbidden(Exception):
    """A denied request; ``body`` is the Status the real API server answers with."""

    def __init__(self, body: Obj) -> None:
        super().__init__(body["message"])
        self.body = body


def forbidden_status(user: str, a: Attributes) -> Obj:
    """The 403 Status kube-apiserver writes for a denied request (responsewriters.Forbidden)."""
    if not a.resource_request:
        detail = f"User {_q(user)} cannot {a.verb} path {_q(a.path)}"
        message = f"forbidden: {detail}"
        details: Obj = {}
    else:
        scope = (f"in the namespace {_q(a.namespace)}" if a.namespace else "at the cluster scope")
        detail = (f"User {_q(user)} cannot {a.verb} resource {_q(a.combined_resource)} in API group "
                  f"{_q(a.group)} {scope}")
        qualified = f"{a.resource}.{a.group}" if a.group else a.resource
        message = (f"{qualified} {_q(a.name)} is forbidden: {detail}" if a.name
                   else f"{qualified} is forbidden: {detail}")
        details = {"kind": a.resource}
        if a.group:
            details["group"] = a.group
        if a.name:
            details["name"] = a.name
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                 "message": message, "reason": "Forbidden", "code": 403}
    if details:
        body["details"] = details
    return body


def forbidden(user: str, a: Attributes) -> Forbidden:
    return Forbidden(forbidden_status(user, a))


def _q(text: str) -> str:
    """Go's %q for the plain strings of these messages."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


__all__ = ["SHIPPED_RBAC", "Attributes", "Binding", "Forbidden", "Identity", "Policy", "RbacError", "Rule",
           "forbidden_status", "request_attributes", "shipped_policy"]
