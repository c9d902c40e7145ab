"""What every command shares: the global options, the consoles, and the adapter factory.

The factory is the one seam tests use: they pass ``obj=CliState(connect=...)`` to the runner, and
the factory returns an adapter over ``dispatch.testing``'s fake cluster. The product always uses
:func:`connect_adapter`.
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from .._adapter import Adapter
    from .._overrides import ConfigOverrides
    from ._jsonpath import Path, Template


class Output(enum.StrEnum):
    """Output formats of ``-o``, as kubectl names them (``jsonpath`` and ``custom-columns`` take a template)."""

    TABLE = "table"
    WIDE = "wide"
    NAME = "name"
    JSON = "json"
    YAML = "yaml"
    JSONPATH = "jsonpath"
    CUSTOM_COLUMNS = "custom-columns"


FORMATS = "table, wide, name, json, yaml, jsonpath=TEMPLATE, custom-columns=HEADER:PATH,..."


@dataclass(frozen=True)
class Format:
    """A parsed ``-o`` value: the format and, for the template formats, the parsed template."""

    output: Output
    template: Template | None = None
    columns: tuple[tuple[str, Path], ...] = ()


def parse_format(value: str) -> Format:
    """Parse ``-o``'s value as kubectl does (``-o jsonpath='{.name}'``, ``-o custom-columns=NAME:.name``).

    A bad value raises ValueError naming what is wrong, so it is a usage error before any request. The
    template parser is loaded only for the template formats (``status NAME`` starts without it)."""
    kind, eq, rest = value.partition("=")
    kind = kind.strip().lower()
    if kind in ("jsonpath", "jsonpath-as-json", "custom-columns"):
        from ._jsonpath import TemplateError, parse_path, parse_template
    if kind in ("jsonpath", "jsonpath-as-json"):
        if kind == "jsonpath-as-json":
            raise ValueError("jsonpath-as-json is not supported; use -o json or -o jsonpath=TEMPLATE")
        if not eq or not rest:
            raise ValueError("jsonpath needs a template: -o jsonpath='{.items[*].name}'")
        try:
            return Format(Output.JSONPATH, template=parse_template(rest))
        except TemplateError as exc:
            raise ValueError(f"bad jsonpath template: {exc}") from None
    if kind == "custom-columns":
        if not eq or not rest:
            raise ValueError("custom-columns needs columns: -o custom-columns=NAME:.name,A:.identity.admission")
        columns: list[tuple[str, Path]] = []
        for spec in rest.split(","):
            header, colon, path = spec.partition(":")
            if not colon or not header.strip() or not path.strip():
                raise ValueError(f"custom-columns: {spec!r} is not HEADER:PATH (e.g. NAME:.name)")
            try:
                columns.append((header.strip(), parse_path(path.strip().strip("{}"))))
            except TemplateError as exc:
                raise ValueError(f"custom-columns: bad path in {spec!r}: {exc}") from None
        return Format(Output.CUSTOM_COLUMNS, columns=tuple(columns))
    try:
        output = Output(kind)
    except ValueError:
        raise ValueError(f"unknown output format {value!r}; formats: {FORMATS}") from None
    if eq:
        raise ValueError(f"-o {kind} takes no template (got {value!r}); formats: {FORMATS}")
    if output in (Output.JSONPATH, Output.CUSTOM_COLUMNS):
        raise ValueError(f"-o {kind} needs a template: -o {kind}=...")
    return Format(output)


@dataclass
class Settings:
    """The global options, as parsed."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    read_only: bool = False
    debug: bool = False
    output: Output = Output.TABLE
    format: Format | None = None
    """The template formats' parsed template (``output`` says which format)."""
    no_headers: bool = False
    request_timeout: float | None = None
    """Seconds a single request (with its retries) may take; None: the library's own bounds."""
    overrides: ConfigOverrides | None = None
    """kubectl's client flags (``--server``, ``--token``, ``--as``, ...), laid over the kubeconfig."""
    verbosity: int = 0
    """kubectl's ``-v``: from 6 on, each request and its answer is printed to stderr."""


def set_format(settings: Settings, value: str) -> None:
    """``-o``'s value into ``settings`` (checked already: by the option's callback, or by ``_plain``)."""
    fmt = parse_format(value)
    settings.output = fmt.output
    settings.format = fmt


def connect_adapter(settings: Settings) -> Adapter:
    """The product's adapter factory: a real connection from the kubeconfig."""
    from .._adapter import Adapter

    adapter = Adapter.connect(
        settings.namespace,
        kubeconfig=settings.kubeconfig,
        context=settings.context,
        read_only=settings.read_only,
        request_timeout=settings.request_timeout,
        overrides=settings.overrides,
    )
    if settings.verbosity >= REQUEST_LOG_LEVEL:
        log_requests(adapter)
    return adapter


REQUEST_LOG_LEVEL = 6
"""kubectl's ``-v=6`` logs each request's method, URL, status and time."""


def log_requests(adapter: Adapter) -> None:
    """Print each request and its answer to stderr, as kubectl's ``-v=6`` does: ``GET URL 200 OK in 12 ms``."""
    import time

    started: dict[int, float] = {}

    async def on_request(request: object) -> None:
        started[id(request)] = time.monotonic()

    async def on_response(response: object) -> None:
        request = getattr(response, "request", None)
        ms = (time.monotonic() - started.pop(id(request), time.monotonic())) * 1000
        print(f"{getattr(request, 'method', '?')} {getattr(request, 'url', '?')} "
              f"{getattr(response, 'status_code', '?')} {getattr(response, 'reason_phrase', '')} in {ms:.0f} ms",
              file=sys.stderr, flush=True)

    adapter.core.kube.observe(on_request, on_response)


def make_console(*, stderr: bool) -> Console:
    """A console for people. Piped into a file or a log, lines are not cut at 80 columns (160 unless
    COLUMNS says otherwise); errors are never wrapped, so each stays one line."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    piped = not (hasattr(stream, "isatty") and stream.isatty())
    width = 160 if piped and "COLUMNS" not in os.environ else None
    return Console(stderr=stderr, soft_wrap=stderr, width=width)


class CliState:
    """Per-invocation state, carried as the click context's ``obj``. The consoles are made on first use,
    so that rich is loaded only by a command that prints through it."""

    def __init__(self, connect: Callable[[Settings], Adapter] = connect_adapter, settings: Settings | None = None,
                 out: Console | None = None, err: Console | None = None) -> None:
        self.connect = connect
        self.settings = settings if settings is not None else Settings()
        self._out = out
        self._err = err
        self._adapter: Adapter | None = None

    @property
    def out(self) -> Console:
        if self._out is None:
            self._out = make_console(stderr=False)
        return self._out

    @property
    def err(self) -> Console:
        if self._err is None:
            self._err = make_console(stderr=True)
        return self._err

    def adapter(self) -> Adapter:
        """Connect on first use (so ``--help`` and usage errors never touch the cluster)."""
        if self._adapter is None:
            self._adapter = self.connect(self.settings)
        return self._adapter

    def shutdown(self) -> None:
        if self._adapter is not None:
            adapter, self._adapter = self._adapter, None
            adapter.shutdown()
