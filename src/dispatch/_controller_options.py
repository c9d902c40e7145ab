"""The controller's command-line settings, declared once.

``dispatch controller`` (typer), ``python -m dispatch.controller`` (the image's entry point, argparse) and
the Helm chart's Deployment all take the same options. Each is one field of :class:`ControllerOptions`,
whose metadata carries its flag, help, bounds, environment variable and chart value; both parsers are
built from these fields and tests hold the chart and the docs to them. A new option is one field here.

This module needs nothing beyond the standard library, so the CLI shows the options (and refuses a bad
value) even where the ``controller`` extra is not installed.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from . import _names as n

LOG_LEVELS = ("debug", "info", "warning", "error")
FOREIGN = ("ready", "ignore")


@dataclass(frozen=True)
class Option:
    """How one setting appears on a command line (and in the chart)."""

    flag: str
    help: str
    kind: type
    """str, int, float or bool (bool: ``--flag``, or ``--flag/--no-flag`` when ``negatable``)."""
    optional: bool = False
    """None is a value (the option is off unless given)."""
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    env: str | None = None
    """The environment variable that supplies the default (the Downward API in the Deployment)."""
    negatable: bool = False
    short: str | None = None
    chart: str | None = None
    """The chart value (``.Values.<path>``) that sets it, if the chart sets it from one value."""
    unit: str = ""
    """What the number counts (``seconds``), said in a refusal."""
    global_: bool = False
    """Taken from the CLI's global options (``--kubeconfig``, ``--context``), not the command's own."""

    def check(self, value: Any) -> Any:
        """``value`` as the controller takes it, or ValueError naming what is wrong with it."""
        if value is None:
            if self.optional:
                return None
            raise ValueError("a value is required")
        if self.kind is float and not math.isfinite(value):
            raise ValueError(f"must be a finite number (got {value!r})")
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise ValueError(f"must be {self.range}{' ' + self.unit if self.unit else ''} (got {value:g})")
        if self.choices:
            if str(value).lower() not in self.choices:
                raise ValueError(f"must be one of {', '.join(self.choices)} (got {value!r})")
            return str(value).lower()
        return value

    @property
    def range(self) -> str:
        return f"{self.low:g} to {self.high:g}" if self.high is not None else f"at least {self.low:g}"

    @property
    def name(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def describe(self) -> str:
        """The help with its bounds, as both parsers show it."""
        extra = []
        if self.low is not None:
            extra.append(self.range)
        if self.choices:
            extra.append("one of " + ", ".join(self.choices))
        return f"{self.help} ({'; '.join(extra)})" if extra else self.help


def _opt(default: Any, flag: str, help: str, kind: type, **kw: Any) -> Any:
    return field(default=default, metadata={"option": Option(flag, help, kind, **kw)})


@dataclass(frozen=True)
class ControllerOptions:
    """Every setting of ``dispatch controller``, with its default; the controller's ``Config`` is built
    from it (:func:`dispatch.controller.run_from_cli`)."""

    kubeconfig: str | None = _opt(None, "--kubeconfig", "kubeconfig file (default: $KUBECONFIG, else in-cluster)",
                                  str, optional=True, env="KUBECONFIG", global_=True)
    context: str | None = _opt(None, "--context", "kubeconfig context", str, optional=True, global_=True)
    namespace: str | None = _opt(None, "--namespace", "Serve only this namespace (default: all).", str,
                                 optional=True, short="-n", chart="controller.namespace")
    metrics_port: int = _opt(8080, "--metrics-port", "Port of /healthz, /readyz and /metrics (0: any free).",
                             int, low=0, high=65535, chart="probes.port")
    metrics_bind_address: str | None = _opt(
        None, "--metrics-bind-address", "Serve /metrics on a listener of its own (127.0.0.1:PORT keeps it on "
        "the host; :PORT with --metrics-secure serves it to authorized callers).", str, optional=True,
        metavar="HOST:PORT")
    metrics_secure: bool = _opt(False, "--metrics-secure", "HTTPS on --metrics-bind-address, for callers the API "
                                "server authenticates and authorizes for get /metrics.", bool)
    metrics_cert_dir: str | None = _opt(None, "--metrics-cert-dir", "tls.crt and tls.key of secure metrics "
                                        "(default: self-signed).", str, optional=True)
    leader_elect: bool = _opt(True, "--leader-elect", "Run as one of several replicas (a Lease).", bool,
                              negatable=True, chart="controller.leaderElect")
    lease_namespace: str = _opt("dispatch-system", "--lease-namespace", "Namespace of the Lease.", str,
                                env="POD_NAMESPACE")
    lease_name: str = _opt("dispatch-admission-controller", "--lease-name", "Name of the Lease.", str)
    identity: str | None = _opt(None, "--identity", "Holder identity (default: host and a random suffix).", str,
                                optional=True, env="POD_NAME")
    workers: int = _opt(4, "--workers", "Workloads decided concurrently.", int, low=1, chart="controller.workers")
    batch: int = _opt(64, "--batch", "Decide up to this many queued Workloads of one namespace from one shared "
                      "read.", int, low=1, chart="controller.batch")
    resync_seconds: float = _opt(60.0, "--resync-seconds", "Re-check waiting Workloads this often even without "
                                 "an event (a safety net), seconds.", float, low=1.0, high=24 * 3600.0,
                                 metavar="SECONDS", unit="seconds", chart="controller.resyncSeconds")
    foreign: str = _opt("ready", "--foreign", "Workloads whose owner is not a TrainJob: pass them at once, or "
                        "leave them Pending untouched.", str, choices=FOREIGN, chart="controller.foreign")
    controller_name: str = _opt(n.CONTROLLER_NAME, "--controller-name", "Own the AdmissionChecks with this "
                                "spec.controllerName.", str)
    log_level: str = _opt("info", "--log-level", "JSON logs on stderr at this level.", str, choices=LOG_LEVELS,
                          metavar="LEVEL", chart="controller.logLevel")
    guard_port: int | None = _opt(None, "--guard-port", "Serve the guard (validating webhook) over HTTPS on this "
                                  "port (default: none).", int, optional=True, low=0, high=65535,
                                  chart="guard.port")
    guard_cert_dir: str = _opt("", "--guard-cert-dir", "tls.crt/tls.key to serve the guard with (else a CA and "
                               "certificate are made there).", str)
    guard_service: str = _opt("dispatch-guard", "--guard-service", "The guard's Service in --lease-namespace: the "
                              "names a certificate the controller makes is valid for.", str)
    guard_webhook: str = _opt("dispatch-guard", "--guard-webhook", "ValidatingWebhookConfiguration (and "
                              "enrolment's Mutating one) whose caBundle to keep ('': none).", str)
    guard_client_ca: str | None = _opt(
        None, "--guard-client-ca", "Answer only callers of the guard presenting a client certificate signed by a "
        "CA in this PEM file (the API server, given one by its admission configuration's kubeConfigFile); "
        "others are refused in the TLS handshake (default: no client certificate asked for).", str, optional=True,
        metavar="FILE")
    guard_client_names: str = _opt("", "--guard-client-names", "With --guard-client-ca: only a client certificate "
                                   "whose subject common name or a DNS name is one of these (comma-separated; "
                                   "default: any the CA signed).", str, metavar="NAMES")
    kube_api_qps: float | None = _opt(
        None, "--kube-api-qps", "Client-side limit of requests a second to the API server, client-go's token "
        "bucket (default and 0: none, as controller-runtime since v0.21; the API server's Priority and Fairness "
        "paces the controller through 429s, whose Retry-After is always honoured).", float, optional=True,
        low=0.0, metavar="QPS", env="DISPATCH_KUBE_API_QPS", chart="controller.kubeAPI.qps")
    kube_api_burst: int = _opt(30, "--kube-api-burst", "Requests sent at once before --kube-api-qps paces them.",
                               int, low=1, env="DISPATCH_KUBE_API_BURST", chart="controller.kubeAPI.burst")
    kueue_namespace: str = _opt("kueue-system", "--kueue-namespace", "Kueue's namespace, holding the MultiKueue "
                                "workers' kubeconfig Secrets.", str, chart="multikueue.kueueNamespace")
    multikueue_worker: bool = _opt(False, "--multikueue-worker", "This cluster is a MultiKueue worker: the guard "
                                   "judges a dispatch TrainJob with MultiKueue's origin label as a manager's copy "
                                   "(elsewhere the label means nothing).", bool, chart="multikueue.worker")

    def __post_init__(self) -> None:
        """Each value within its bounds (ValueError naming the option); how the options combine (secure
        metrics need their own listener) is the controller's check, which logs it."""
        for f in fields(self):
            try:
                object.__setattr__(self, f.name, option(f.name).check(getattr(self, f.name)))
            except ValueError as exc:
                raise ValueError(f"{option(f.name).flag}: {exc}") from None


def options() -> tuple[Option, ...]:
    """Every option, in declaration order."""
    return tuple(f.metadata["option"] for f in fields(ControllerOptions))


def option(name: str) -> Option:
    """The option of field ``name``."""
    for f in fields(ControllerOptions):
        if f.name == name:
            return f.metadata["option"]  # type: ignore[no-any-return]
    raise KeyError(name)


def default(name: str) -> Any:
    """Field ``name``'s default (before any environment variable)."""
    for f in fields(ControllerOptions):
        if f.name == name:
            return None if f.default is MISSING else f.default
    raise KeyError(name)


DEFAULTS = ControllerOptions()
"""Every default, as one object."""


def _argparse_type(opt: Option) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return opt.check(opt.kind(text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def parser(prog: str = "dispatch-controller", description: str | None = None,
           environ: Sequence[tuple[str, str]] | None = None) -> argparse.ArgumentParser:
    """An argparse parser of every option (``python -m dispatch.controller``); defaults from ``environ``
    (default: this process's environment) where an option names a variable."""
    env = dict(environ) if environ is not None else dict(os.environ)
    p = argparse.ArgumentParser(prog=prog, description=description)
    for f in fields(ControllerOptions):
        opt: Option = f.metadata["option"]
        dflt = (env.get(opt.env) or f.default) if opt.env else f.default
        names = [opt.flag, *([opt.short] if opt.short else [])]
        if opt.kind is bool:
            action: Any = argparse.BooleanOptionalAction if opt.negatable else "store_true"
            p.add_argument(*names, dest=f.name, action=action, default=dflt, help=opt.describe())
        else:
            p.add_argument(*names, dest=f.name, type=_argparse_type(opt), default=dflt, metavar=opt.metavar,
                           help=opt.describe())
    return p


def parse(argv: Sequence[str] | None = None, *, environ: Sequence[tuple[str, str]] | None = None,
          prog: str = "dispatch-controller", description: str | None = None) -> ControllerOptions:
    """``argv`` as one :class:`ControllerOptions`; a bad value exits 2 naming the option (argparse's way)."""
    p = parser(prog, description, environ)
    values = vars(p.parse_args(argv))
    try:
        return ControllerOptions(**values)
    except ValueError as exc:
        p.error(str(exc))
