"""deploy/monitoring: the alerts and the dashboard query only series the controller exports.

A renamed metric would leave an alert that never fires and a panel that stays empty; nothing else would
notice, so every series named in an expression (dispatch's own, and the standard ``rest_client_*``,
``workqueue_*`` and ``leader_election_*`` ones) is checked against the controller's own registries (the
Prometheus series a family gives: ``_total`` for counters, ``_bucket/_sum/_count`` for histograms). The
only other series allowed are Prometheus's ``up`` and kube-state-metrics' ``kube_endpoint_address``.
Every alert links an existing runbook page.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

import yaml
from prometheus_client import CollectorRegistry

from dispatch.controller import Metrics
from dispatch.controller._guard import Guard

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
RUNBOOK = "https://github.com/phpboyscout/dispatch/blob/main/docs/runbook/"
# a series name: a word followed by `{`, `[` or `)`, or standing alone, that is not a PromQL function,
# keyword, label or template word
WORD = re.compile(r"(?<![\w$\"'.])([a-z_][a-z0-9_]*)\b(?!\s*\()")
NOT_SERIES = {"by", "on", "unless", "and", "or", "le", "sum", "max", "min", "rate", "absent", "count", "without",
              "ignoring", "bool", "offset", "histogram_quantile", "answer", "reason", "outcome", "kind", "code",
              "method", "verb", "resource", "name", "namespace", "cluster", "job", "endpoint", "ready", "m"}
OTHERS = {"up", "kube_endpoint_address"}


def exported() -> set[str]:
    registry = CollectorRegistry()
    Metrics.create(registry)
    Guard(cast(Any, None), registry)      # the guard's series live on the controller's registry
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{s}" for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


def series(expr: str) -> set[str]:
    without_labels = re.sub(r"\{[^}]*\}", "", expr)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_labels)
    without_numbers = re.sub(r"\b\d+(\.\d+)?\b", "", without_ranges)
    return {w for w in WORD.findall(without_numbers) if w not in NOT_SERIES}


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    return [r for g in doc["spec"]["groups"] for r in g["rules"]]


def test_series_finds_every_name_in_an_expression() -> None:
    assert series('sum by (le) (rate(dispatch_guard_review_seconds_bucket{namespace=~"$namespace"}[5m])) > 5') == {
        "dispatch_guard_review_seconds_bucket"}
    assert series('absent(up{job="x"} == 1) or sum(dispatch_leader) < 1') == {"up", "dispatch_leader"}


def test_the_alerts_cover_what_breaks_the_promise_with_exported_series() -> None:
    got = {str(r["alert"]): str(r["expr"]) for r in rules()}
    assert set(got) == {
        "DispatchWorkloadWaitingTooLong", "DispatchControllerNotReady", "DispatchNoLeader", "DispatchReconcileErrors",
        "DispatchGuardReviewsFailing", "DispatchGuardSlow", "DispatchGuardNoReadyEndpoint",
        "DispatchClusterQueueSkippingCheck", "DispatchPodHeldUnproven"}
    assert "dispatch_clusterqueues_skipping_check" in got["DispatchClusterQueueSkippingCheck"]
    assert "> 0" in got["DispatchClusterQueueSkippingCheck"]
    assert "dispatch_pods_held_unproven_longest_seconds" in got["DispatchPodHeldUnproven"]
    assert 'answer="error"' in got["DispatchGuardReviewsFailing"]
    assert 'leader_election_master_status{name="dispatch-admission-controller"}' in got["DispatchNoLeader"]
    assert 'up{job="dispatch-controller-metrics"}' in got["DispatchControllerNotReady"]  # the Service's name
    used = {name for expr in got.values() for name in series(expr)}
    assert used - OTHERS <= exported(), used - OTHERS - exported()
    assert used & {"dispatch_guard_reviews_total", "dispatch_guard_review_seconds_bucket"}


def test_every_alert_links_an_existing_runbook_page() -> None:
    for rule in rules():
        url = str(rule["annotations"]["runbook_url"])
        assert url.startswith(RUNBOOK), (rule["alert"], url)
        page, _, anchor = url[len(RUNBOOK):].partition("#")
        path = ROOT / "docs" / "runbook" / page
        assert path.is_file(), (rule["alert"], url)
        if anchor:
            heads = [re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                     for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)]
            assert anchor in heads, (rule["alert"], anchor)
        assert rule["labels"]["severity"] in ("warning", "critical")


def dashboard() -> dict[str, Any]:
    return dict(json.loads((MONITORING / "dispatch-dashboard.json").read_text()))


def test_every_dashboard_query_reads_exported_series_of_the_chosen_cluster_and_namespace() -> None:
    dash = dashboard()
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= len(dash["panels"]) >= 18
    used = {name for e in exprs for name in series(e)}
    assert used <= exported(), used - exported()
    assert {"dispatch_workloads_waiting", "dispatch_reconcile_errors_total", "dispatch_leader",
            "dispatch_guard_reviews_total", "dispatch_guard_review_seconds_bucket", "rest_client_requests_total",
            "workqueue_depth", "leader_election_master_status"} <= used
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert {"datasource", "cluster", "namespace"} <= set(variables)
    for e in exprs:                     # each series of each query is narrowed to the chosen ones
        for m in re.finditer(r"\b([a-z_]+)\{([^}]*)\}", e):
            assert 'cluster=~"$cluster"' in m.group(2) and 'namespace=~"$namespace"' in m.group(2), e
        assert e.count("{") == len(re.findall(r"\b(?:dispatch|rest_client|workqueue|leader_election)_\w+", e)), e


def test_monitoring_is_not_applied_by_default() -> None:
    root = yaml.safe_load((MONITORING.parent / "kustomization.yaml").read_text())
    base = yaml.safe_load((MONITORING.parent / "base" / "kustomization.yaml").read_text())
    assert "monitoring" not in json.dumps([root, base])
