"""The Helm chart (charts/dispatch) and the kustomize manifests (deploy/) install the same controller.

``helm template`` with default values and ``kubectl kustomize deploy/`` must give the same objects, field
for field, except for the differences listed in ``ALLOWED`` (Helm's own labels). The values a person
changes (image, replicas, the namespace served, resources, metrics) must land where they mean to, bad
values must fail with a message naming them, and what the chart renders must be accepted by the real API
server (``kubectl apply --dry-run=server``). helm is built from its Go module (testbed/build-helm.sh);
kubectl is the testbed's.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch import ENROL_LABEL

pytestmark = pytest.mark.testbed

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "dispatch"
DEPLOY = ROOT / "deploy"
NAMESPACE = "dispatch-system"
Obj = dict[str, Any]

# What the chart may add that deploy/ has not: Helm's bookkeeping labels, on objects and pod templates.
# (The one other difference, kept out of the comparison by rendering with --include-crds: `helm install`
# applies crds/ before the templates, and `helm upgrade` leaves the CRD alone.)
ALLOWED = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}


@pytest.fixture(scope="module")
def tools() -> tuple[Path, Path]:
    if shutil.which("go") is None:
        pytest.skip("the Go toolchain is needed to build helm and kubectl")
    from dispatch.testbed import _tools

    return _tools.helm(), _tools.kubectl()


def _docs(text: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(text) if d]


def render(tools: tuple[Path, Path], *sets: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    helm, _ = tools
    argv = [str(helm), "template", "dispatch", str(CHART), "--namespace", NAMESPACE, "--include-crds"]
    for s in sets:
        argv += ["--set", s]
    return subprocess.run(argv, capture_output=True, text=True, check=check)


def chart(tools: tuple[Path, Path], *sets: str) -> list[Obj]:
    return _docs(render(tools, *sets).stdout)


def kustomized(tools: tuple[Path, Path]) -> list[Obj]:
    _, kubectl = tools
    return _docs(subprocess.run([str(kubectl), "kustomize", str(DEPLOY)], capture_output=True, text=True,
                                check=True).stdout)


def key(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def without_allowed(obj: Obj) -> Obj:
    out = copy.deepcopy(obj)
    holders = [out["metadata"]]
    template = (out.get("spec") or {}).get("template")
    if isinstance(template, dict) and "metadata" in template:
        holders.append(template["metadata"])
    for meta in holders:
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in ALLOWED}
        if labels:
            meta["labels"] = labels
        else:
            meta.pop("labels", None)
    return out


def by_key(docs: list[Obj]) -> dict[tuple[str, str, str, str], Obj]:
    out = {key(d): d for d in docs}
    assert len(out) == len(docs), "two objects with the same kind, namespace and name"
    return out


def container(docs: list[Obj]) -> Obj:
    [dep] = [d for d in docs if d["kind"] == "Deployment"]
    return dict(dep["spec"]["template"]["spec"]["containers"][0])


def test_the_chart_lints(tools: tuple[Path, Path]) -> None:
    helm, _ = tools
    got = subprocess.run([str(helm), "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert got.returncode == 0, got.stdout + got.stderr


def test_the_charts_crd_and_version_are_deploys(tools: tuple[Path, Path]) -> None:
    """Helm installs crds/ verbatim (never templated, upgraded or deleted): it must be deploy/'s file."""
    import dispatch

    assert (CHART / "crds" / "submissionrecords.yaml").read_text() == (DEPLOY / "base" / "crd.yaml").read_text()
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    kustomization = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    assert meta["appVersion"] == dispatch.__version__ == kustomization["images"][0]["newTag"]


def test_the_chart_and_deploy_render_the_same_objects(tools: tuple[Path, Path]) -> None:
    rendered = by_key(chart(tools, "createNamespace=true"))
    shipped = by_key(kustomized(tools))
    assert sorted(rendered) == sorted(shipped), "after changing deploy/, run scripts/sync-chart"
    drift = {k: (without_allowed(rendered[k]), shipped[k]) for k in shipped
             if without_allowed(rendered[k]) != shipped[k]}
    assert drift == {}, ("after changing deploy/, run scripts/sync-chart (RBAC, CRD, monitoring files) and edit "
                         "the chart's other templates to match:\n"
                         + json.dumps({"/".join(k): v for k, v in drift.items()}, indent=1)[:4000])
    for obj in rendered.values():       # the allowed difference is really there: Helm's labels on everything
        if obj["kind"] != "CustomResourceDefinition":     # but crds/, which Helm does not template
            assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm", key(obj)


def test_values_land_where_they_mean_to(tools: tuple[Path, Path]) -> None:
    docs = chart(tools, "image.repository=registry.example/dispatch", "image.tag=9.9.9", "replicas=3",
                 "controller.namespace=team-a", "resources.requests.cpu=250m", "resources.limits.memory=1Gi",
                 "controller.workers=8", "controller.logLevel=debug")
    c = container(docs)
    assert c["image"] == "registry.example/dispatch:9.9.9"
    assert next(d for d in docs if d["kind"] == "Deployment")["spec"]["replicas"] == 3
    assert "--namespace=team-a" in c["args"] and "--workers=8" in c["args"] and "--log-level=debug" in c["args"]
    assert c["resources"] == {"requests": {"cpu": "250m", "memory": "192Mi"}, "limits": {"memory": "1Gi"}}
    assert not [d for d in docs if d["kind"] == "Namespace"]        # the release's namespace by default


def test_metrics_modes(tools: tuple[Path, Path]) -> None:
    secure = chart(tools)
    c = container(secure)
    assert c["args"][:4] == ["--leader-elect", "--metrics-port=8081", "--metrics-bind-address=:8443",
                             "--metrics-secure"]
    [svc] = metrics_services(secure)
    assert svc["spec"]["ports"] == [{"name": "https", "port": 8443, "targetPort": "metrics"}]
    assert any(d["metadata"]["name"] == "dispatch-metrics-reader" for d in secure)

    mounted = container(chart(tools, "metrics.certSecret=dispatch-metrics-tls"))
    assert "--metrics-cert-dir=/etc/dispatch/metrics-certs" in mounted["args"]
    assert mounted["volumeMounts"] == [
        GUARD_MOUNT, {"name": "metrics-certs", "mountPath": "/etc/dispatch/metrics-certs", "readOnly": True}]

    local = chart(tools, "metrics.mode=localhost")
    assert "--metrics-bind-address=127.0.0.1:8443" in container(local)["args"]
    assert "--metrics-secure" not in container(local)["args"]
    assert not metrics_services(local)            # nothing to reach from outside the pod
    assert [p["name"] for p in container(local)["ports"]] == ["probes", "guard"]

    plain = chart(tools, "metrics.mode=plain")
    assert not any(a.startswith("--metrics-bind-address") for a in container(plain)["args"])
    [svc] = metrics_services(plain)
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8081, "targetPort": "probes"}]


GUARD_MOUNT = {"name": "guard-certs", "mountPath": "/var/run/dispatch-guard"}


def metrics_services(docs: list[Obj]) -> list[Obj]:
    return [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "dispatch-controller-metrics"]


def guard_objects(docs: list[Obj]) -> list[tuple[str, str]]:
    return sorted((d["kind"], d["metadata"]["name"]) for d in docs if "guard" in d["metadata"]["name"]
                  or d["kind"].startswith("ValidatingAdmissionPolicy"))


def test_the_guard_is_on_by_default_and_can_be_turned_off(tools: tuple[Path, Path]) -> None:
    on = chart(tools)
    assert guard_objects(on) == [("MutatingWebhookConfiguration", "dispatch-guard"),
                                 ("Service", "dispatch-guard"), ("ValidatingAdmissionPolicy", "dispatch-floors"),
                                 ("ValidatingAdmissionPolicy", "dispatch-identity"),
                                 ("ValidatingAdmissionPolicy", "dispatch-pods"),
                                 ("ValidatingAdmissionPolicyBinding", "dispatch-floors"),
                                 ("ValidatingAdmissionPolicyBinding", "dispatch-identity"),
                                 ("ValidatingAdmissionPolicyBinding", "dispatch-pods"),
                                 ("ValidatingWebhookConfiguration", "dispatch-guard")]
    c = container(on)
    assert c["args"][4:6] == ["--guard-port=9443", "--guard-cert-dir=/var/run/dispatch-guard"]
    assert {"name": "guard", "containerPort": 9443} in c["ports"] and c["volumeMounts"] == [GUARD_MOUNT]

    # In another namespace the webhook calls the Service there (the controller's certificate follows it).
    elsewhere = _docs(subprocess.run(
        [str(tools[0]), "template", "dispatch", str(CHART), "--namespace", "ml-platform"],
        capture_output=True, text=True, check=True).stdout)
    [hook] = [d for d in elsewhere if d["kind"] == "ValidatingWebhookConfiguration"]
    assert hook["webhooks"][0]["clientConfig"]["service"] == {
        "name": "dispatch-guard", "namespace": "ml-platform", "path": "/validate-trainjob", "port": 443}
    # the pod creates of dispatch objects: the same Service, its own path, failing closed
    assert hook["webhooks"][1]["clientConfig"]["service"] == {
        "name": "dispatch-guard", "namespace": "ml-platform", "path": "/validate-pod", "port": 443}
    assert hook["webhooks"][1]["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                             "operations": ["CREATE"], "scope": "Namespaced"}]
    assert hook["webhooks"][1]["objectSelector"] == hook["webhooks"][0]["objectSelector"]
    assert hook["webhooks"][1]["failurePolicy"] == "Fail"
    # enrolment's mutating webhook: the same Service, its own path, opted-in namespaces only
    [mutating] = [d for d in elsewhere if d["kind"] == "MutatingWebhookConfiguration"]
    assert mutating["webhooks"][0]["clientConfig"]["service"] == {
        "name": "dispatch-guard", "namespace": "ml-platform", "path": "/mutate-trainjob", "port": 443}
    assert mutating["webhooks"][0]["namespaceSelector"] == {"matchLabels": {ENROL_LABEL: "true"}}

    off = chart(tools, "guard.enabled=false")
    # The CEL policies need no server, so they stay: A and the started mark still only rise, and pods
    # keep their labels and dispatch's finalizer, and a floor is written only by a writer of its namespace.
    assert guard_objects(off) == [("ValidatingAdmissionPolicy", "dispatch-floors"),
                                  ("ValidatingAdmissionPolicy", "dispatch-identity"),
                                  ("ValidatingAdmissionPolicy", "dispatch-pods"),
                                  ("ValidatingAdmissionPolicyBinding", "dispatch-floors"),
                                  ("ValidatingAdmissionPolicyBinding", "dispatch-identity"),
                                  ("ValidatingAdmissionPolicyBinding", "dispatch-pods")]
    c = container(off)
    assert not [a for a in c["args"] if a.startswith("--guard")]
    assert "volumeMounts" not in c and [p["name"] for p in c["ports"]] == ["probes", "metrics"]


def test_the_guard_with_cert_manager(tools: tuple[Path, Path]) -> None:
    docs = chart(tools, "guard.certManager.enabled=true")
    [hook] = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    assert hook["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/dispatch-guard"}
    [cert] = [d for d in docs if d["kind"] == "Certificate"]
    assert cert["spec"]["secretName"] == "dispatch-guard-tls"
    assert cert["spec"]["dnsNames"] == [f"dispatch-guard.{NAMESPACE}.svc",
                                        f"dispatch-guard.{NAMESPACE}.svc.cluster.local"]
    assert cert["spec"]["issuerRef"] == {"name": "dispatch-guard-selfsigned", "kind": "Issuer"}
    assert [d["spec"] for d in docs if d["kind"] == "Issuer"] == [{"selfSigned": {}}]
    c = container(docs)
    assert "--guard-webhook=" in c["args"]           # cert-manager keeps the caBundle, not the controller
    assert c["volumeMounts"] == [{**GUARD_MOUNT, "readOnly": True}]
    [dep] = [d for d in docs if d["kind"] == "Deployment"]
    assert {"name": "guard-certs", "secret": {"secretName": "dispatch-guard-tls"}} in dep["spec"]["template"]["spec"][
        "volumes"]

    own = chart(tools, "guard.certManager.enabled=true", "guard.certManager.issuerRef.name=corp-ca",
                "guard.certManager.issuerRef.kind=ClusterIssuer")
    [cert] = [d for d in own if d["kind"] == "Certificate"]
    assert cert["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}
    assert not [d for d in own if d["kind"] == "Issuer"]


def test_bad_values_fail_naming_them(tools: tuple[Path, Path]) -> None:
    got = render(tools, "metrics.mode=open", check=False)
    assert got.returncode != 0 and 'metrics.mode must be secure, localhost or plain, not "open"' in got.stderr
    got = render(tools, "metrics.mode=plain", "metrics.certSecret=x", check=False)
    assert got.returncode != 0 and "metrics.certSecret is for metrics.mode=secure" in got.stderr
    got = render(tools, "guard.enabled=false", "guard.certManager.enabled=true", check=False)
    assert got.returncode != 0 and "guard.certManager is for guard.enabled=true" in got.stderr
    got = render(tools, "guard.port=8443", check=False)
    assert got.returncode != 0 and "guard.port must differ from metrics.port" in got.stderr


@pytest.mark.parametrize("sets", [(), ("metrics.mode=localhost",), ("metrics.certSecret=dispatch-metrics-tls",
                                                                     "controller.namespace=default"),
                                  ("fullnameOverride=ml-dispatch", "networkPolicy.enabled=true", "hostNetwork=true",
                                   "commonLabels.team=ml", "env[0].name=HTTPS_PROXY", "env[0].value=http://p:3128",
                                   "networkPolicy.guard.from[0].ipBlock.cidr=10.0.0.0/8",
                                   "controller.kubeAPI.qps=20", "probes.liveness.failureThreshold=6")])
def test_the_api_server_accepts_what_the_chart_renders(
    tools: tuple[Path, Path], testbed_kubeconfig: str, sets: tuple[str, ...]
) -> None:
    _, kubectl = tools
    # A dry run creates nothing, so the namespaced objects need their namespace to exist already.
    subprocess.run([str(kubectl), "--kubeconfig", testbed_kubeconfig, "create", "namespace", NAMESPACE],
                   capture_output=True, text=True)
    text = render(tools, "createNamespace=true", *sets).stdout
    got = subprocess.run([str(kubectl), "--kubeconfig", testbed_kubeconfig, "apply", "--dry-run=server", "-f", "-"],
                         input=text,
                         capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    assert got.stdout.count("(server dry run)") == len(_docs(text)), got.stdout


def test_the_monitoring_extras_render_with_kustomize(tools: tuple[Path, Path]) -> None:
    _, kubectl = tools
    docs = _docs(subprocess.run([str(kubectl), "kustomize", str(DEPLOY / "monitoring")], capture_output=True,
                                text=True, check=True).stdout)
    assert sorted((d["kind"], d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs) == [
        ("ConfigMap", NAMESPACE, "dispatch-grafana-dashboard"), ("PrometheusRule", NAMESPACE, "dispatch-controller"),
        ("ServiceMonitor", NAMESPACE, "dispatch-controller")]
    [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
    assert json.loads(cm["data"]["dispatch-dashboard.json"])["uid"] == "dispatch-admission"
    [sm] = [d for d in docs if d["kind"] == "ServiceMonitor"]
    [svc] = metrics_services(kustomized(tools))
    assert sm["spec"]["endpoints"][0]["port"] in [p["name"] for p in svc["spec"]["ports"]]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()


def test_the_charts_monitoring_objects_are_deploy_monitorings(tools: tuple[Path, Path]) -> None:
    for name in ("prometheusrule.yaml", "servicemonitor.yaml", "dispatch-dashboard.json"):
        assert (CHART / "files" / name).read_text() == (DEPLOY / "monitoring" / name).read_text(), name
    assert not [d for d in chart(tools) if d["apiVersion"].startswith("monitoring.coreos.com")]  # off by default
    on = [d for d in chart(tools, "monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true",
                           "monitoring.dashboard.enabled=true")
          if d["kind"] in ("ServiceMonitor", "PrometheusRule") or d["metadata"]["name"] == "dispatch-grafana-dashboard"]
    _, kubectl = tools
    shipped = by_key(_docs(subprocess.run([str(kubectl), "kustomize", str(DEPLOY / "monitoring")],
                                          capture_output=True, text=True, check=True).stdout))
    rendered = by_key(on)
    assert sorted(rendered) == sorted(shipped)
    assert {k: without_allowed(v) for k, v in rendered.items()} == shipped


SELECTOR = {"app.kubernetes.io/name": "dispatch", "app.kubernetes.io/component": "admission-controller"}


def pod_spec(docs: list[Obj]) -> Obj:
    [dep] = [d for d in docs if d["kind"] == "Deployment"]
    return dict(dep["spec"]["template"]["spec"])


def test_high_availability_by_default_each_a_value(tools: tuple[Path, Path]) -> None:
    """A PDB, a spread over nodes and a priority class keep one webhook replica up through a drain."""
    docs = chart(tools)
    [pdb] = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert pdb["metadata"]["name"] == "dispatch-controller"
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": SELECTOR}}
    spec = pod_spec(docs)
    assert spec["priorityClassName"] == "system-cluster-critical"
    node, zone = spec["topologySpreadConstraints"]
    assert (node["topologyKey"], node["whenUnsatisfiable"], node["maxSkew"]) == (
        "kubernetes.io/hostname", "DoNotSchedule", 1)
    assert node["labelSelector"] == {"matchLabels": SELECTOR} and node["matchLabelKeys"] == ["pod-template-hash"]
    assert (zone["topologyKey"], zone["whenUnsatisfiable"]) == ("topology.kubernetes.io/zone", "ScheduleAnyway")

    off = chart(tools, "podDisruptionBudget.enabled=false", "priorityClassName=", "topologySpreadConstraints=null")
    assert not [d for d in off if d["kind"] == "PodDisruptionBudget"]
    assert "priorityClassName" not in pod_spec(off) and "topologySpreadConstraints" not in pod_spec(off)
    three = chart(tools, "replicas=3", "podDisruptionBudget.minAvailable=2", "priorityClassName=dispatch-critical")
    assert [d["spec"]["minAvailable"] for d in three if d["kind"] == "PodDisruptionBudget"] == [2]
    assert pod_spec(three)["priorityClassName"] == "dispatch-critical"

    got = render(tools, "replicas=1", check=False)
    assert got.returncode != 0 and (
        "podDisruptionBudget.minAvailable (1) must be below replicas (1): no replica could ever be evicted"
        in got.stderr), got.stderr
    assert chart(tools, "replicas=1", "podDisruptionBudget.enabled=false")      # a single replica, knowingly


def test_the_schema_refuses_typos_and_wrong_types(tools: tuple[Path, Path]) -> None:
    got = render(tools, "replica=3", check=False)
    assert got.returncode != 0 and "additional properties 'replica' not allowed" in got.stderr, got.stderr
    got = render(tools, "image.registy=r.example", check=False)
    assert got.returncode != 0 and "at '/image': additional properties 'registy' not allowed" in got.stderr
    got = render(tools, "replicas=two", check=False)
    assert got.returncode != 0 and "at '/replicas'" in got.stderr, got.stderr
    got = render(tools, "guard.certManager.issuerRef.nam=corp-ca", check=False)
    assert got.returncode != 0 and "additional properties 'nam' not allowed" in got.stderr, got.stderr


DIGEST = "sha256:" + "ab" * 32


def test_image_registry_digest_and_pull_secrets(tools: tuple[Path, Path]) -> None:
    assert container(chart(tools))["image"] == "dispatch-controller:0.1.0"
    assert container(chart(tools, "image.registry=registry.example.com/platform/"))["image"] == (
        "registry.example.com/platform/dispatch-controller:0.1.0")
    pinned = chart(tools, "image.registry=registry.example.com", "image.tag=9.9.9", f"image.digest={DIGEST}",
                   "imagePullSecrets[0].name=regcred")
    assert container(pinned)["image"] == f"registry.example.com/dispatch-controller@{DIGEST}"
    assert pod_spec(pinned)["imagePullSecrets"] == [{"name": "regcred"}]


def test_security_contexts_are_values_without_a_user_id(tools: tuple[Path, Path]) -> None:
    spec = pod_spec(chart(tools))
    assert spec["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert container(chart(tools))["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    own = chart(tools, "podSecurityContext.runAsUser=1000680000", "podSecurityContext.fsGroup=1000680000",
                "securityContext.readOnlyRootFilesystem=true")
    assert pod_spec(own)["securityContext"]["runAsUser"] == 1000680000
    assert pod_spec(own)["securityContext"]["fsGroup"] == 1000680000


def test_labels_for_services_and_the_prometheus_objects(tools: tuple[Path, Path]) -> None:
    docs = chart(tools, "serviceLabels.team=ml", "monitoring.serviceMonitor.enabled=true",
                 "monitoring.serviceMonitor.labels.release=kube-prometheus-stack",
                 "monitoring.prometheusRule.enabled=true", "monitoring.prometheusRule.labels.release=kps")
    services = {d["metadata"]["name"]: d["metadata"]["labels"] for d in docs if d["kind"] == "Service"}
    assert sorted(services) == ["dispatch-controller-metrics", "dispatch-guard"]
    assert all(labels["team"] == "ml" for labels in services.values())
    [sm] = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kps"


def test_multikueue_roles_are_deploys_and_only_on_request(tools: tuple[Path, Path]) -> None:
    """A manager's Secret reader and a worker's reader render only when asked for, equal to deploy/multikueue
    and deploy/worker; Kueue's namespace lands in the Role and the controller's flag."""
    plain = chart(tools)
    assert not [d for d in plain if d["metadata"]["name"] in ("dispatch-multikueue-workers", "dispatch-worker-reader",
                                                               "dispatch-multikueue-copier")]
    assert "--multikueue-worker" not in container(plain)["args"]
    # a worker (issue 35 item 3): the flag, and deploy/worker's roles bound to MultiKueue's service account
    worker = chart(tools, "multikueue.worker=true")
    assert "--multikueue-worker" in container(worker)["args"]
    [copier] = [d for d in worker if d["kind"] == "ClusterRoleBinding"
                and d["metadata"]["name"] == "dispatch-multikueue-copier"]
    assert copier["subjects"] == [{"kind": "ServiceAccount", "name": "multikueue-sa", "namespace": "kueue-system"}]
    docs = by_key(chart(tools, "multikueue.workerSecrets={worker-1-kubeconfig,worker-2-kubeconfig}",
                        "multikueue.workerReader.enabled=true"))
    _, kubectl = tools
    shipped = _docs(subprocess.run([str(kubectl), "kustomize", str(DEPLOY / "multikueue")], capture_output=True,
                                   text=True, check=True).stdout)
    shipped += _docs((DEPLOY / "worker" / "rbac.yaml").read_text())
    for obj in shipped:
        assert without_allowed(docs[key(obj)]) == obj, key(obj)
    moved = chart(tools, "multikueue.workerSecrets={w-a}", "multikueue.kueueNamespace=kueue-alt")
    [role] = [d for d in moved if d["kind"] == "Role" and d["metadata"]["name"] == "dispatch-multikueue-workers"]
    assert role["metadata"]["namespace"] == "kueue-alt" and role["rules"][0]["resourceNames"] == ["w-a"]
    assert "--kueue-namespace=kueue-alt" in container(moved)["args"]
    bad = render(tools, "multikueue.workerSecrets={Not_A_Name}", check=False)
    assert bad.returncode != 0 and "workerSecrets" in bad.stderr


def test_deploy_worker_installs_dispatch_on_a_worker_as_the_chart_does(tools: tuple[Path, Path]) -> None:
    """Issue 34: ``kubectl apply -k deploy/worker/`` is a whole worker install (deploy/ with ``--multikueue-worker``
    and the worker's roles), field for field what the chart renders with ``multikueue.worker=true``."""
    _, kubectl = tools
    shipped = by_key(_docs(subprocess.run([str(kubectl), "kustomize", str(DEPLOY / "worker")], capture_output=True,
                                          text=True, check=True).stdout))
    rendered = by_key(chart(tools, "createNamespace=true", "multikueue.worker=true"))
    assert sorted(rendered) == sorted(shipped)
    drift = {k: (without_allowed(rendered[k]), shipped[k]) for k in shipped
             if without_allowed(rendered[k]) != shipped[k]}
    assert drift == {}, json.dumps({"/".join(k): v for k, v in drift.items()}, indent=1)[:4000]
    assert "--multikueue-worker" in container(list(shipped.values()))["args"]
    kinds = {(k[1], k[3]) for k in shipped}
    assert {("ValidatingWebhookConfiguration", "dispatch-guard"), ("ValidatingAdmissionPolicy", "dispatch-identity"),
            ("ClusterRoleBinding", "dispatch-multikueue-copier")} <= kinds, sorted(kinds)


def _value(values: Obj, path: str) -> Any:
    node: Any = values
    for part in path.split("."):
        node = node[part]
    return node


def _other(value: Any, choices: tuple[str, ...]) -> Any:
    """A value of the same kind as ``value`` that differs from it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 3
    if choices:
        return next(c for c in choices if c != value)
    return f"{value or 'team'}-alt"


def test_every_controller_option_the_chart_sets_reaches_the_controller_as_its_value_says(
        tools: tuple[Path, Path]) -> None:
    """Each ControllerOptions field the chart sets from a value: the controller the chart runs parses its
    args (``python -m dispatch.controller``'s own parser) to exactly what values.yaml says, with the
    defaults (where the template leaves a flag out, the controller's default must be the value's) and with
    every value changed."""
    from dispatch._controller_options import options, parse

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    charted = [(o, o.chart) for o in options() if o.chart]
    assert {c for _, c in charted} >= {"controller.workers", "controller.batch", "controller.resyncSeconds",
                                          "controller.foreign", "controller.logLevel", "multikueue.kueueNamespace"}
    got = parse(container(chart(tools))["args"], environ=[])
    for o, path in charted:
        default = _value(values, path)
        # an empty value or a 0 leaves the flag out (the controller's default: none); a false switch is a value
        unset = default in ("", None) or (default == 0 and not isinstance(default, bool))
        assert getattr(got, o.name) == o.check(None if unset else default), (o.flag, path)
    changed = [(o, path, _other(_value(values, path), o.choices)) for o, path in charted]
    sets = [f"{path}={str(v).lower() if isinstance(v, bool) else v}" for _, path, v in changed]
    got = parse(container(chart(tools, *sets))["args"], environ=[])
    for o, path, v in changed:
        assert getattr(got, o.name) == o.check(v), (o.flag, path, v)


# ------------------------------------------------------------------ the knobs of Kueue's and JobSet's charts


def test_common_labels_and_name_override(tools: tuple[Path, Path]) -> None:
    docs = chart(tools, "commonLabels.team=ml-platform", "commonLabels.cost-center=c42")
    for obj in docs:
        if obj["kind"] != "CustomResourceDefinition":          # crds/ is never templated
            assert obj["metadata"]["labels"]["team"] == "ml-platform", key(obj)
    [dep] = [d for d in docs if d["kind"] == "Deployment"]
    assert dep["spec"]["template"]["metadata"]["labels"]["cost-center"] == "c42"
    assert dep["spec"]["selector"]["matchLabels"] == SELECTOR          # labels never reach the selector

    named = chart(tools, "nameOverride=dispatch-a")
    selector = {**SELECTOR, "app.kubernetes.io/name": "dispatch-a"}
    [dep] = [d for d in named if d["kind"] == "Deployment"]
    assert dep["spec"]["selector"]["matchLabels"] == selector
    assert dep["spec"]["template"]["metadata"]["labels"].items() >= selector.items()
    for svc in (d for d in named if d["kind"] == "Service"):       # both Services still find the pods
        assert svc["spec"]["selector"] == selector, svc["metadata"]["name"]
    [pdb] = [d for d in named if d["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["selector"]["matchLabels"] == selector


def test_extra_env_volumes_host_network_and_probe_timings(tools: tuple[Path, Path]) -> None:
    docs = chart(tools, "env[0].name=HTTPS_PROXY", "env[0].value=http://proxy:3128",
                 "envFrom[0].secretRef.name=dispatch-extra", "volumes[0].name=ca",
                 "volumes[0].configMap.name=corp-ca", "volumeMounts[0].name=ca",
                 "volumeMounts[0].mountPath=/etc/ssl/corp", "hostNetwork=true",
                 "probes.liveness.periodSeconds=20", "probes.liveness.failureThreshold=6",
                 "probes.readiness.timeoutSeconds=7")
    c, spec = container(docs), pod_spec(docs)
    assert c["env"][-1] == {"name": "HTTPS_PROXY", "value": "http://proxy:3128"}
    assert [e["name"] for e in c["env"][:2]] == ["POD_NAME", "POD_NAMESPACE"]     # the controller's own stay
    assert c["envFrom"] == [{"secretRef": {"name": "dispatch-extra"}}]
    assert c["volumeMounts"] == [GUARD_MOUNT, {"name": "ca", "mountPath": "/etc/ssl/corp"}]
    assert spec["volumes"][-1] == {"name": "ca", "configMap": {"name": "corp-ca"}}
    assert (spec["hostNetwork"], spec["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert c["livenessProbe"] == {"httpGet": {"path": "/healthz", "port": "probes"}, "initialDelaySeconds": 5,
                                  "periodSeconds": 20, "timeoutSeconds": 3, "failureThreshold": 6}
    assert c["readinessProbe"]["timeoutSeconds"] == 7
    plain = pod_spec(chart(tools))
    assert "hostNetwork" not in plain and "envFrom" not in container(chart(tools))


def test_a_network_policy_only_on_request_admitting_the_controllers_ports(tools: tuple[Path, Path]) -> None:
    assert not [d for d in chart(tools) if d["kind"] == "NetworkPolicy"]
    docs = chart(tools, "networkPolicy.enabled=true", "networkPolicy.guard.from[0].ipBlock.cidr=10.0.0.0/24",
                 "networkPolicy.metrics.from[0].namespaceSelector.matchLabels.name=monitoring")
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["podSelector"] == {"matchLabels": SELECTOR}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    guard, metrics, probes = policy["spec"]["ingress"]
    assert guard == {"ports": [{"port": "guard", "protocol": "TCP"}], "from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]}
    assert metrics == {"ports": [{"port": "metrics", "protocol": "TCP"}],
                       "from": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]}
    assert probes == {"ports": [{"port": "probes", "protocol": "TCP"}]}          # the kubelet's, from anywhere
    ports = {p["name"] for p in container(docs)["ports"]}
    assert {"guard", "metrics", "probes"} <= ports                            # the named ports exist
    off = [d for d in chart(tools, "networkPolicy.enabled=true", "guard.enabled=false", "metrics.mode=plain")
           if d["kind"] == "NetworkPolicy"]
    assert [r["ports"][0]["port"] for r in off[0]["spec"]["ingress"]] == ["probes"]


def test_deploys_network_policy_is_the_charts(tools: tuple[Path, Path]) -> None:
    """deploy/networkpolicy (kustomize, optional) is the chart's policy with the guard's port admitting the
    example range its comment says to replace with the API server's addresses (issue 35 item 8)."""
    _, kubectl = tools
    shipped = by_key(_docs(subprocess.run([str(kubectl), "kustomize", str(DEPLOY / "networkpolicy")],
                                          capture_output=True, text=True, check=True).stdout))
    rendered = by_key([d for d in chart(tools, "networkPolicy.enabled=true",
                                        "networkPolicy.guard.from[0].ipBlock.cidr=192.0.2.0/24")
                       if d["kind"] == "NetworkPolicy"])
    assert {k: without_allowed(v) for k, v in rendered.items()} == shipped
    [policy] = shipped.values()
    guard = policy["spec"]["ingress"][0]
    assert guard == {"ports": [{"port": "guard", "protocol": "TCP"}], "from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]}
    assert policy["spec"]["podSelector"] == {"matchLabels": SELECTOR}
    assert "192.0.2.0/24" in (DEPLOY / "networkpolicy" / "kustomization.yaml").read_text()  # the comment says so
    assert not [d for d in kustomized(tools) if d["kind"] == "NetworkPolicy"]  # not part of deploy/


def test_the_guards_client_ca_from_a_configmap_or_a_secret(tools: tuple[Path, Path]) -> None:
    """guard.clientAuth: the CA mounted read-only from a ConfigMap or a Secret, and the flags the controller
    parses to that file and those names (issue 35 item 8); off by default; one source, and names only with one."""
    from dispatch._controller_options import parse

    plain = container(chart(tools))
    assert not [a for a in plain["args"] if a.startswith("--guard-client")]
    assert "guard-client-ca" not in {m["name"] for m in plain["volumeMounts"]}
    for source, volume in (("configMap", {"configMap": {"name": "apiserver-webhook-ca"}}),
                           ("secret", {"secret": {"secretName": "apiserver-webhook-ca"}})):
        docs = chart(tools, f"guard.clientAuth.{source}=apiserver-webhook-ca", "guard.clientAuth.key=bundle.pem",
                     "guard.clientAuth.names={kube-apiserver,kube-apiserver-2}")
        got = parse(container(docs)["args"], environ=[])
        assert got.guard_client_ca == "/etc/dispatch/guard-client-ca/bundle.pem"
        assert got.guard_client_names == "kube-apiserver,kube-apiserver-2"
        [mount] = [m for m in container(docs)["volumeMounts"] if m["name"] == "guard-client-ca"]
        assert mount == {"name": "guard-client-ca", "mountPath": "/etc/dispatch/guard-client-ca", "readOnly": True}
        [vol] = [v for v in pod_spec(docs)["volumes"] if v["name"] == "guard-client-ca"]
        assert vol == {"name": "guard-client-ca", **volume}
    anyone = parse(container(chart(tools, "guard.clientAuth.configMap=ca"))["args"], environ=[])
    assert (anyone.guard_client_ca, anyone.guard_client_names) == ("/etc/dispatch/guard-client-ca/ca.crt", "")
    for sets, says in ((("guard.clientAuth.configMap=a", "guard.clientAuth.secret=b"), "both give the client CA"),
                       (("guard.clientAuth.names={kube-apiserver}",), "guard.clientAuth.names needs"),
                       (("guard.enabled=false", "guard.clientAuth.secret=b"), "guard.clientAuth is for guard.enabled")):
        failed = render(tools, *sets, check=False)
        assert failed.returncode != 0 and says in failed.stderr, (sets, failed.stderr)


def test_the_client_qps_and_burst(tools: tuple[Path, Path]) -> None:
    assert not [a for a in container(chart(tools))["args"] if a.startswith("--kube-api")]
    c = container(chart(tools, "controller.kubeAPI.qps=20", "controller.kubeAPI.burst=40"))
    assert "--kube-api-qps=20" in c["args"] and "--kube-api-burst=40" in c["args"]


def test_metrics_with_cert_manager_and_a_verifying_service_monitor(tools: tuple[Path, Path]) -> None:
    docs = chart(tools, "metrics.certManager.enabled=true", "monitoring.serviceMonitor.enabled=true")
    [cert] = [d for d in docs if d["kind"] == "Certificate"]
    assert cert["metadata"]["name"] == "dispatch-metrics" and cert["spec"]["secretName"] == "dispatch-metrics-tls"
    assert cert["spec"]["dnsNames"] == [f"dispatch-controller-metrics.{NAMESPACE}.svc",
                                        f"dispatch-controller-metrics.{NAMESPACE}.svc.cluster.local"]
    assert cert["spec"]["issuerRef"] == {"name": "dispatch-metrics-selfsigned", "kind": "Issuer"}
    c = container(docs)
    assert "--metrics-cert-dir=/etc/dispatch/metrics-certs" in c["args"]
    assert {"name": "metrics-certs", "secret": {"secretName": "dispatch-metrics-tls"}} in pod_spec(docs)["volumes"]
    [sm] = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert sm["spec"]["endpoints"][0]["tlsConfig"] == {
        "ca": {"secret": {"name": "dispatch-metrics-tls", "key": "ca.crt"}},
        "serverName": f"dispatch-controller-metrics.{NAMESPACE}.svc"}             # verified, not skipped

    both = chart(tools, "metrics.certManager.enabled=true", "guard.certManager.enabled=true",
                 "metrics.certManager.issuerRef.name=corp-ca", "metrics.certManager.issuerRef.kind=ClusterIssuer")
    certs = {d["metadata"]["name"]: d["spec"]["issuerRef"] for d in both if d["kind"] == "Certificate"}
    assert certs == {"dispatch-metrics": {"name": "corp-ca", "kind": "ClusterIssuer"},
                     "dispatch-guard": {"name": "dispatch-guard-selfsigned", "kind": "Issuer"}}
    got = render(tools, "metrics.certManager.enabled=true", "metrics.mode=plain", check=False)
    assert got.returncode != 0 and "metrics.certManager is for metrics.mode=secure" in got.stderr
    got = render(tools, "metrics.certManager.enabled=true", "metrics.certSecret=x", check=False)
    assert got.returncode != 0 and "metrics.certManager and metrics.certSecret" in got.stderr


def test_the_service_monitors_authorization_and_tls_are_values(tools: tuple[Path, Path]) -> None:
    default = [d for d in chart(tools, "monitoring.serviceMonitor.enabled=true") if d["kind"] == "ServiceMonitor"]
    endpoint = default[0]["spec"]["endpoints"][0]
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True} and "bearerTokenFile" in endpoint
    docs = chart(tools, "monitoring.serviceMonitor.enabled=true",
                 "monitoring.serviceMonitor.authorization.type=Bearer",
                 "monitoring.serviceMonitor.authorization.credentials.name=prometheus-token",
                 "monitoring.serviceMonitor.authorization.credentials.key=token",
                 "monitoring.serviceMonitor.tlsConfig.ca.configMap.name=corp-ca",
                 "monitoring.serviceMonitor.tlsConfig.ca.configMap.key=ca.crt",
                 "monitoring.serviceMonitor.tlsConfig.serverName=metrics.example")
    [sm] = [d for d in docs if d["kind"] == "ServiceMonitor"]
    endpoint = sm["spec"]["endpoints"][0]
    assert "bearerTokenFile" not in endpoint
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": "prometheus-token", "key": "token"}}
    assert endpoint["tlsConfig"] == {"ca": {"configMap": {"name": "corp-ca", "key": "ca.crt"}},
                                     "serverName": "metrics.example"}


def test_alerts_link_the_runbook_base_and_name_the_releases_namespace(tools: tuple[Path, Path]) -> None:
    helm, _ = tools
    text = subprocess.run([str(helm), "template", "dispatch", str(CHART), "--namespace", "ml-platform",
                           "--set", "monitoring.prometheusRule.enabled=true", "--set",
                           "monitoring.prometheusRule.runbookBaseURL=https://wiki.example/dispatch/"],
                          capture_output=True, text=True, check=True).stdout
    [rule] = [d for d in _docs(text) if d["kind"] == "PrometheusRule"]
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert all(r["annotations"]["runbook_url"].startswith("https://wiki.example/dispatch/") for r in rules)
    texts = json.dumps(rule)
    assert "dispatch-system" not in texts and "kubectl -n ml-platform get pods" in texts


def test_fullname_override_renames_the_releases_objects_and_what_refers_to_them(tools: tuple[Path, Path]) -> None:
    everything = ("guard.certManager.enabled=true", "metrics.certManager.enabled=true", "networkPolicy.enabled=true",
                  "multikueue.workerSecrets={w}", "monitoring.serviceMonitor.enabled=true",
                  "monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true")
    docs = chart(tools, "fullnameOverride=ml-dispatch", *everything)
    default = chart(tools, *everything)
    mine = {(d["kind"], d["metadata"]["name"]) for d in docs if d["metadata"].get("namespace") == NAMESPACE}
    assert mine and all(name.startswith("ml-dispatch-") for _, name in mine), sorted(mine)
    assert {(d["kind"], d["metadata"]["name"]) for d in default
            if d["metadata"].get("namespace") == NAMESPACE} == {(kind, "dispatch-" + name[len("ml-dispatch-"):])
                                                                 for kind, name in mine}
    cluster_scoped = sorted((d["kind"], d["metadata"]["name"]) for d in docs if "namespace" not in d["metadata"])
    assert cluster_scoped == sorted((d["kind"], d["metadata"]["name"]) for d in default
                                    if "namespace" not in d["metadata"])       # documented names stay
    spec = pod_spec(docs)
    assert spec["serviceAccountName"] == "ml-dispatch-controller"
    for binding in (d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        for subject in binding["subjects"]:
            if subject["kind"] == "ServiceAccount" and subject["namespace"] == NAMESPACE:
                assert subject["name"] == "ml-dispatch-controller", binding["metadata"]["name"]
    for hook in (d for d in docs if d["kind"].endswith("WebhookConfiguration")):
        assert {w["clientConfig"]["service"]["name"] for w in hook["webhooks"]} == {"ml-dispatch-guard"}
        assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/ml-dispatch-guard"
    certs = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Certificate"}
    assert certs["ml-dispatch-guard"]["dnsNames"][0] == f"ml-dispatch-guard.{NAMESPACE}.svc"
    assert certs["ml-dispatch-metrics"]["dnsNames"][0] == f"ml-dispatch-controller-metrics.{NAMESPACE}.svc"
    assert {"name": "guard-certs", "secret": {"secretName": "ml-dispatch-guard-tls"}} in spec["volumes"]
    assert {"name": "metrics-certs", "secret": {"secretName": "ml-dispatch-metrics-tls"}} in spec["volumes"]
    # the controller makes its own guard certificate for the renamed Service when cert-manager does not
    from dispatch._controller_options import parse
    from dispatch.controller._controller import Config, guard_hosts_in
    own = parse(container(chart(tools, "fullnameOverride=ml-dispatch"))["args"], environ=[])
    config = Config.from_options(own)
    assert guard_hosts_in(config.lease_namespace, config.guard_service)[0] == "ml-dispatch-guard.dispatch-system.svc"
    rule = json.dumps([d for d in docs if d["kind"] == "PrometheusRule"])
    assert 'job=\\"ml-dispatch-controller-metrics\\"' in rule and 'endpoint=\\"ml-dispatch-guard\\"' in rule
    assert "dispatch-controller-metrics" not in rule.replace("ml-dispatch-controller-metrics", "")
    [sm] = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert sm["spec"]["endpoints"][0]["tlsConfig"]["serverName"] == f"ml-dispatch-controller-metrics.{NAMESPACE}.svc"
