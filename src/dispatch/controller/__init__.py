"""dispatch's Kueue admission-check controller (``dispatch controller``).

Under Kueue, Kueue re-admits a TrainJob as soon as JobSet reports no active Jobs, while pods of the
previous execution may still be Terminating. This controller owns the AdmissionChecks whose
``spec.controllerName`` is ``dispatch.phpboyscout.uk/admission`` and holds each such check ``Pending``
until one consistent read shows no pod of the object that may still run; then it raises the admission
number A on the TrainJob and sets the check ``Ready`` with ``podSetUpdates`` labels carrying
(job-id, submission, A), so Kueue admits and every pod of the new execution carries its identity.

Decisions made here:

* **Workloads not owned by a TrainJob** (a batch Job, a JobSet, a plain Pod group, no owner): the rule
  and A are defined for TrainJobs only, so by default (``foreign="ready"``) the check passes them at once
  with a message saying so; a ClusterQueue shared with other kinds is not starved. ``foreign="ignore"``
  leaves them Pending untouched (then route other kinds to a ClusterQueue without the check). A TrainJob
  not opened by dispatch (no dispatch labels or runtime patch) still gets the rule through the
  ``jobset-name`` selection, but no A.
* **Retry and Rejected are never set.** Pods that remain are not a failure of the Workload: Retry would
  evict it and release its quota (the seed wants the quota kept while it waits), and Rejected would
  deactivate it until a person reactivates it. A check in Retry or Rejected (set by someone else) and a
  Ready check are left alone: Kueue resets every check to Pending on eviction, and the next admission
  comes back through this controller. A refusal to raise A (a webhook denial, say) keeps the check
  Pending with the refusal in its message and a Warning Event, and is retried with backoff.

Entry points: :func:`run` (async, for embedding and tests) and :func:`run_from_cli` (the CLI calls it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

try:  # the controller extra: without it, say which extra to install rather than only which module is missing
    # isort: off
    import structlog
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
    import cryptography  # noqa: F401  (the guard's and secure metrics' certificates)
    # isort: on
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(
        f"dispatch.controller needs the controller extra ({exc.name or exc} is not installed): "
        "pip install 'trainjob-dispatch[controller]'", name=exc.name) from exc

from .. import _kube as k
from .._controller_options import ControllerOptions
from ..errors import DispatchError, Refused
from ._checks import ACTIVE_MESSAGE, ACTIVE_REASON
from ._controller import DEFAULTS, LOG_LEVEL, METRICS_PORT, Config, Controller, default_identity
from ._http import Authorizer, MetricsServing
from ._metrics import Metrics
from ._reconcile import WAITING_PREFIX, Outcome, Reconciler

__all__ = [
    "ACTIVE_MESSAGE",
    "ACTIVE_REASON",
    "DEFAULTS",
    "LOG_LEVEL",
    "METRICS_PORT",
    "WAITING_PREFIX",
    "Authorizer",
    "Config",
    "Controller",
    "ControllerOptions",
    "Metrics",
    "MetricsServing",
    "Outcome",
    "Reconciler",
    "configure_logging",
    "default_identity",
    "run",
    "run_from_cli",
]


async def run(kube: k.Kube, config: Config | None = None, *, stop: asyncio.Event | None = None,
              metrics: Metrics | None = None) -> None:
    """Run the controller on ``kube`` until ``stop`` is set or the task is cancelled."""
    await Controller(kube, config, metrics=metrics).run(stop)


class _Stderr:
    """Whatever ``sys.stderr`` is at write time (a test's capture, a redirected stream)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


MESSAGE_KEY = "msg"
"""Where a JSON log line carries its message: ``msg``, as Kubernetes' own components (klog's JSON format)
and controller-runtime's zap logs do, so one pipeline rule parses dispatch next to Kueue and JobSet."""
_TAKEN = ("msg", "message")


def _keep_message_keys(logger: Any, name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Nothing but the message under ``msg`` or ``message``: a field passed under either name (a Kubernetes
    condition's message, say) moves to ``detail``, so a pipeline mapping either never takes it for the line's
    message."""
    for key in _TAKEN:
        if key in event:
            value = event.pop(key)
            event["detail" if "detail" not in event else f"detail_{key}"] = value
    return event


def configure_logging(level: str = "info") -> None:
    """JSON lines on stderr, one object per event: the message under ``msg``, the level, an ISO timestamp."""
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _keep_message_keys,
            structlog.processors.EventRenamer(MESSAGE_KEY),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    # What the standard library logs (asyncio's "exception never retrieved", a library's warning) goes out
    # as JSON lines too, its traceback inside the object: a log pipeline never meets a bare traceback.
    # Warnings and worse only, unless debugging: the HTTP client logs every request at info.
    handler = logging.StreamHandler(_Stderr())
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name,
                           structlog.processors.TimeStamper(fmt="iso", utc=True)],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, _keep_message_keys,
                    structlog.processors.EventRenamer(MESSAGE_KEY), structlog.processors.JSONRenderer()],
    ))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(numeric if numeric <= logging.DEBUG else max(numeric, logging.WARNING))


def run_from_cli(options: ControllerOptions) -> int:
    """Run until SIGTERM/SIGINT with ``options`` (every setting of ``dispatch controller``, one object).
    Returns the exit code: 0 after a clean stop, 1 on a fatal error.

    ``namespace=None`` serves Workloads in all namespaces. ``metrics_port`` serves /healthz, /readyz and
    /metrics (0 picks a free port). In a pod, leave ``kubeconfig`` None to use in-cluster credentials.
    ``metrics_bind_address`` (``HOST:PORT``) moves /metrics to a listener of its own, ``127.0.0.1:PORT`` to
    keep it on the pod, and ``metrics_secure`` serves it there over HTTPS to authorized callers only
    (``metrics_cert_dir`` holds tls.crt/tls.key; self-signed without it). ``guard_port`` serves the guard
    webhook over HTTPS (None: no guard), with a certificate for its Service in ``lease_namespace``.
    """
    o = options
    # A pod may be stopped while it starts: a SIGTERM before the loop's handlers exist is kept, and honoured
    # as a clean stop once they do, rather than ending the process with Python's default action.
    early: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: early.append(signum))
    configure_logging(o.log_level)
    log = structlog.get_logger("dispatch.controller")
    serving: MetricsServing | None = None
    if o.metrics_bind_address is not None:
        try:
            serving = MetricsServing.parse(o.metrics_bind_address, secure=o.metrics_secure,
                                           cert_dir=o.metrics_cert_dir)
        except ValueError as exc:
            log.error("invalid option", option="metrics-bind-address", error=str(exc))
            return 1
    elif o.metrics_secure or o.metrics_cert_dir is not None:
        log.error("invalid option", option="metrics-secure",
                  error="secure metrics need their own listener: pass --metrics-bind-address (e.g. :8443)")
        return 1
    config = Config.from_options(o, metrics_serving=serving)
    try:
        config.guard_clients()  # a CA file that cannot be used stops the start, naming the option
    except ValueError as exc:
        log.error("invalid option", option="guard-client-ca", error=str(exc))
        return 1

    async def main() -> int:
        try:
            kube = k.Kube.connect(namespace=o.namespace, kubeconfig=Path(o.kubeconfig) if o.kubeconfig else None,
                                  context=o.context, qps=o.kube_api_qps or 0.0, burst=o.kube_api_burst)
        except Refused as exc:
            log.error("cannot connect", error=str(exc))
            return 1
        registry = CollectorRegistry()
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=registry)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        if early:
            stop.set()
        try:
            await Controller(kube, config, metrics=Metrics.create(registry)).run(stop)
        except DispatchError as exc:
            log.error("controller failed", error=str(exc), reason=exc.reason)
            return 1
        except OSError as exc:
            log.error("controller failed", error=str(exc))
            return 1
        finally:
            await kube.aclose()
        return 0

    return asyncio.run(main())
