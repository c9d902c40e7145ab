"""deploy/monitoring: the alerts and the dashboard query only series the controller exports.

A renamed metric would leave an alert that never fires and a panel that stays empty; nothing else would
notice, so every ``dispatch_*`` series named in an expression is checked against the controller's own
registry (the Prometheus series a family gives: ``_total`` for counters, ``_bucket/_sum/_count`` for
histograms).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from dispatch.controller import Metrics

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
SERIES = re.compile(r"\bdispatch_[a-z_]+\b")


def exported() -> set[str]:
    registry = CollectorRegistry()
    Metrics.create(registry)
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{s}" for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


def rules() -> list[dict[str, object]]:
    doc = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    return [r for g in doc["spec"]["groups"] for r in g["rules"]]


def test_the_alerts_cover_waiting_readiness_and_errors_with_exported_series() -> None:
    got = {str(r["alert"]): str(r["expr"]) for r in rules()}
    assert set(got) == {"DispatchWorkloadWaitingTooLong", "DispatchControllerNotReady", "DispatchReconcileErrors"}
    assert "dispatch_workloads_longest_wait_seconds" in got["DispatchWorkloadWaitingTooLong"]
    assert "dispatch_reconcile_errors_total" in got["DispatchReconcileErrors"]
    assert 'up{job="dispatch-controller-metrics"}' in got["DispatchControllerNotReady"]  # the Service's name
    used = {name for expr in got.values() for name in SERIES.findall(expr)}
    assert used and used <= exported(), used - exported()


def test_every_dashboard_panel_queries_exported_series() -> None:
    dash = json.loads((MONITORING / "dispatch-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= len(dash["panels"]) >= 8
    used = {name for e in exprs for name in SERIES.findall(e)}
    assert used <= exported(), used - exported()
    assert {"dispatch_workloads_waiting", "dispatch_reconcile_errors_total", "dispatch_leader"} <= used


def test_monitoring_is_not_applied_by_default() -> None:
    root = yaml.safe_load((MONITORING.parent / "kustomization.yaml").read_text())
    base = yaml.safe_load((MONITORING.parent / "base" / "kustomization.yaml").read_text())
    assert "monitoring" not in json.dumps([root, base])
