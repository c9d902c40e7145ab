"""Rendering: rich tables for people; JSON and YAML with every field of the library's records."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import yaml
from rich.table import Table
from rich.text import Text

from .._records import Cessation, Identity, RemainingPod, Status
from ._state import CliState, Output

_STATE_STYLE = {
    "Running": "green",
    "Held": "yellow",
    "Queued": "cyan",
    "Succeeded": "blue",
    "Failed": "red",
    "Closing": "magenta",
}


def age(created: datetime | None, now: datetime | None = None) -> str:
    """kubectl-style age: 42s, 5m, 3h, 2d."""
    if created is None:
        return "-"
    now = now or datetime.now(UTC)
    seconds = int(max(0.0, (now - created).total_seconds()))
    return duration(seconds)


def duration(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 2 * 3600:
        return f"{s // 60}m{s % 60:02d}s" if s < 600 else f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d"


def identity_dict(identity: Identity) -> dict[str, Any]:
    return {"jobId": identity.job_id, "submission": identity.submission, "admission": identity.admission}


def pod_dict(pod: RemainingPod) -> dict[str, Any]:
    """A remaining pod with the same keys as in ``Status.to_dict()``, plus the library's description."""
    return {**pod.to_dict(), "description": pod.describe()}


def emit(state: CliState, data: Any, human: Callable[[], None]) -> None:
    """Print ``data`` as JSON/YAML when asked, else call ``human`` to print for people."""
    fmt = state.settings.output
    if fmt is Output.JSON:
        state.out.file.write(json.dumps(data, indent=2) + "\n")
    elif fmt is Output.YAML:
        state.out.file.write(yaml.safe_dump(data, sort_keys=False))
    else:
        human()
    state.out.file.flush()


def state_text(value: str) -> Text:
    return Text(value, style=_STATE_STYLE.get(value, ""))


def status_table(statuses: Sequence[Status], *, title: str | None = None) -> Table:
    table = Table(title=title, box=None, header_style="bold", pad_edge=False, expand=False)
    table.add_column("NAME", no_wrap=True)
    table.add_column("STATE", no_wrap=True)
    table.add_column("IDENTITY", no_wrap=True)
    table.add_column("A", justify="right", no_wrap=True)
    table.add_column("MODE", no_wrap=True)
    table.add_column("AGE", justify="right", no_wrap=True)
    mixed = any(not s.managed for s in statuses)  # the DISPATCH column shows when some are not dispatch's
    if mixed:
        table.add_column("DISPATCH", no_wrap=True)
    table.add_column("CAUSE", overflow="fold")
    for s in statuses:
        cells: list[str | Text] = [
            s.name,
            state_text(s.state.value),
            f"{s.identity.job_id}/{s.identity.submission}" if s.managed else "-",
            str(s.identity.admission) if s.managed else "-",
            s.mode if not s.queue else f"{s.mode} ({s.queue})",
            age(s.created),
        ]
        if mixed:
            cells.append("yes" if s.managed else "no")
        cells.append(Text(str(s.cause)))
        table.add_row(*cells)
    return table


def pods_table(pods: Iterable[RemainingPod], *, waited: Callable[[RemainingPod], str] | None = None) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("POD", no_wrap=True)
    table.add_column("NODE", no_wrap=True)
    table.add_column("NODE STATE", no_wrap=True)
    table.add_column("PHASE", no_wrap=True)
    table.add_column("TERMINATING", no_wrap=True)
    table.add_column("A", justify="right", no_wrap=True)
    if waited is not None:
        table.add_column("WAITING", justify="right", no_wrap=True)
    for p in pods:
        node_style = "green" if p.node_state == "Ready=True" else "red"
        row: list[str | Text] = [
            p.name,
            p.node or "-",
            Text(p.node_state, style=node_style),
            p.phase,
            "yes" if p.terminating else "no",
            "-" if p.admission is None else str(p.admission),
        ]
        if waited is not None:
            row.append(waited(p))
        table.add_row(*row)
    return table


def print_status(state: CliState, status: Status) -> None:
    def human() -> None:
        state.out.print(status_table([status]))
        for warning in status.warnings:
            state.err.print(Text(f"warning: {warning}"))
        if status.remaining:
            state.out.print()
            state.out.print("[bold]remaining pods[/] (a previous execution may still run):")
            state.out.print(pods_table(status.remaining))

    emit(state, status.to_dict(), human)


def print_statuses(state: CliState, statuses: Sequence[Status]) -> None:
    def human() -> None:
        if not statuses:
            state.err.print("no dispatch objects found (`dispatch status --all` lists every TrainJob)")
            return
        state.out.print(status_table(statuses))

    emit(state, {"items": [s.to_dict() for s in statuses]}, human)


def cessation_dict(name: str, cessation: Cessation) -> dict[str, Any]:
    data = {"name": name, **cessation.to_dict()}
    data["pods"] = [pod_dict(p) for p in cessation.remaining]
    return data


def print_cessation(state: CliState, name: str, cessation: Cessation) -> None:
    def human() -> None:
        verdict = "[green]ceased[/]" if cessation.ceased else "[red]not ceased[/]"
        state.out.print(f"{name}: {verdict}: ", end="")
        state.out.print(Text(cessation.reason))
        if cessation.remaining:
            state.out.print(pods_table(cessation.remaining))

    emit(state, cessation_dict(name, cessation), human)
