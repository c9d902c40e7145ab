"""``python -m dispatch.controller``: the container's entry point, independent of the CLI's options parser."""

from __future__ import annotations

import argparse
import os

from . import DEFAULTS, LOG_LEVEL, METRICS_PORT, run_from_cli


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dispatch-controller", description=__doc__)
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG") or None)
    p.add_argument("--context", default=None)
    p.add_argument("--namespace", default=None, help="serve one namespace (default: all)")
    p.add_argument("--metrics-port", type=int, default=METRICS_PORT,
                   help="plain HTTP port of /healthz and /readyz, and of /metrics unless --metrics-bind-address")
    p.add_argument("--metrics-bind-address", default=None, metavar="HOST:PORT",
                   help="serve /metrics on a listener of its own: 127.0.0.1:PORT keeps it on the pod, "
                        ":PORT with --metrics-secure serves it to authorized callers")
    p.add_argument("--metrics-secure", action="store_true",
                   help="HTTPS on --metrics-bind-address; each scrape's bearer token is checked with the API "
                        "server (TokenReview, then SubjectAccessReview for get /metrics)")
    p.add_argument("--metrics-cert-dir", default=None,
                   help="tls.crt and tls.key of secure metrics (default: a self-signed certificate)")
    p.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", DEFAULTS.lease_namespace))
    p.add_argument("--lease-name", default=DEFAULTS.lease_name)
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or None)
    p.add_argument("--workers", type=int, default=DEFAULTS.workers)
    p.add_argument("--batch", type=int, default=DEFAULTS.batch,
                   help="decide up to this many queued Workloads of one namespace from one shared read")
    p.add_argument("--resync-seconds", type=float, default=DEFAULTS.resync_seconds)
    p.add_argument("--foreign", choices=("ready", "ignore"), default=DEFAULTS.foreign)
    p.add_argument("--log-level", default=LOG_LEVEL)
    p.add_argument("--controller-name", default=DEFAULTS.controller_name,
                   help="own the AdmissionChecks with this spec.controllerName (default: dispatch's)")
    p.add_argument("--guard-port", type=int, default=DEFAULTS.guard_port,
                   help="serve the guard (validating webhook) over HTTPS on this port (default: no guard)")
    p.add_argument("--guard-cert-dir", default=DEFAULTS.guard_cert_dir,
                   help="tls.crt/tls.key to serve with (else a CA and certificate are made there)")
    p.add_argument("--guard-webhook", default=DEFAULTS.guard_webhook,
                   help="Validating (and enrolment's Mutating) WebhookConfiguration whose caBundle to keep "
                        "('' : none)")
    p.add_argument("--kueue-namespace", default=DEFAULTS.kueue_namespace,
                   help="Kueue's namespace, holding the MultiKueue workers' kubeconfig Secrets")
    a = p.parse_args(argv)
    return run_from_cli(
        kubeconfig=a.kubeconfig, context=a.context, namespace=a.namespace, metrics_port=a.metrics_port,
        leader_elect=a.leader_elect, lease_namespace=a.lease_namespace, lease_name=a.lease_name,
        identity=a.identity, workers=a.workers, batch=a.batch, resync_seconds=a.resync_seconds, foreign=a.foreign,
        log_level=a.log_level, controller_name=a.controller_name, metrics_bind_address=a.metrics_bind_address,
        metrics_secure=a.metrics_secure, metrics_cert_dir=a.metrics_cert_dir,
        guard_port=a.guard_port,
        guard_cert_dir=a.guard_cert_dir, guard_webhook=a.guard_webhook, kueue_namespace=a.kueue_namespace,
    )


if __name__ == "__main__":
    raise SystemExit(main())
