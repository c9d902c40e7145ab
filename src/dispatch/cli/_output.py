"""Rendering: tables for people (rich on a terminal, kubectl's plain columns when piped); JSON and YAML with
every field of the library's records; kubectl's ``name``, ``wide``, ``jsonpath`` and ``custom-columns``.

rich, PyYAML and the template parser are loaded by the function that prints with them, after the command's
requests: ``status NAME`` sends its first request without them (``tests/cli/test_cli_start.py``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .._api import TRAINJOBS, Res
from .._records import Cessation, Identity, RemainingPod, Status
from ._state import CliState, Output

if TYPE_CHECKING:
    from rich.table import Table
    from rich.text import Text

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


def resource_name(res: Res, name: str) -> str:
    """``trainjob.trainer.kubeflow.org/NAME``, as ``kubectl get -o name`` prints it (``pod/NAME`` in core)."""
    kind = res.kind.lower()
    return f"{kind}.{res.group}/{name}" if res.group else f"{kind}/{name}"


def trainjob_names(*names: str) -> list[str]:
    return [resource_name(TRAINJOBS, name) for name in names]


def emit(state: CliState, data: Any, human: Callable[[], None], *, names: Sequence[str] = ()) -> None:
    """Print ``data`` in the format ``-o`` asked for, else call ``human`` to print for people.

    ``names`` are what ``-o name`` prints (one per line); ``-o jsonpath`` and ``-o custom-columns`` read
    ``data``, the same document ``-o json`` prints, so a template tried on one works on the other."""
    fmt = state.settings.output
    template = state.settings.format
    if fmt is Output.JSON:
        state.out.file.write(json.dumps(data, indent=2) + "\n")
    elif fmt is Output.YAML:
        import yaml

        state.out.file.write(yaml.safe_dump(data, sort_keys=False))
    elif fmt is Output.NAME:
        for name in names:
            state.out.file.write(name + "\n")
    elif fmt is Output.JSONPATH and template is not None and template.template is not None:
        state.out.file.write(template.template.render(data))  # no newline added, as kubectl's
    elif fmt is Output.CUSTOM_COLUMNS and template is not None:
        from ._jsonpath import scalar

        items = data["items"] if isinstance(data, dict) and set(data) == {"items"} else [data]
        grid = Grid([Column(header) for header, _ in template.columns])
        for item in items:
            grid.add([",".join(scalar(v) for v in path.find(item, item)) or "<none>"
                      for _, path in template.columns])
        show(state, grid)
    else:
        human()
    state.out.file.flush()


def state_text(value: str) -> Text:
    from rich.text import Text

    return Text(value, style=_STATE_STYLE.get(value, ""))


@dataclass(frozen=True)
class Column:
    header: str
    right: bool = False
    fold: bool = False
    """The one column that may wrap, on a terminal only (a long cause)."""


@dataclass
class Grid:
    """A table for people: rich with colours on a terminal; piped, kubectl's plain columns, one row per
    line, cells separated by three spaces, nothing padded after the last cell and nothing wrapped, so
    ``awk '{print $1}'`` and ``cut`` see every row whole."""

    columns: list[Column]
    rows: list[list[str | Text]] = field(default_factory=list)

    def add(self, cells: Sequence[str | Text]) -> None:
        self.rows.append(list(cells))

    def table(self, *, headers: bool = True) -> Table:
        from rich.table import Table

        table = Table(box=None, header_style="bold", pad_edge=False, expand=False, show_header=headers)
        for c in self.columns:
            table.add_column(c.header, justify="right" if c.right else "left", no_wrap=not c.fold,
                             overflow="fold" if c.fold else "ellipsis")
        for row in self.rows:
            table.add_row(*row)
        return table

    def lines(self, *, headers: bool = True) -> list[str]:
        from rich.text import Text

        cells = [[_one_line(c.header) for c in self.columns]] if headers else []
        cells += [[_one_line(c.plain if isinstance(c, Text) else c) for c in row] for row in self.rows]
        if not cells:
            return []
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.columns))]
        out = []
        for row in cells:
            parts = [cell.rjust(widths[i]) if self.columns[i].right else cell.ljust(widths[i])
                     for i, cell in enumerate(row)]
            out.append("   ".join(parts).rstrip())
        return out


_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def _one_line(text: str) -> str:
    """A cell on one line: a newline or tab inside a value would split a row for ``awk``."""
    return _CONTROL.sub(" ", text)


def show(state: CliState, grid: Grid) -> None:
    """Print a grid: rich on a terminal, plain columns when piped; ``--no-headers`` drops the header."""
    headers = not state.settings.no_headers
    if state.out.is_terminal:
        state.out.print(grid.table(headers=headers))
    else:
        for line in grid.lines(headers=headers):
            state.out.file.write(line + "\n")
        state.out.file.flush()


def status_grid(statuses: Sequence[Status], *, wide: bool = False, namespaces: bool = False) -> Grid:
    """NAME STATE IDENTITY A MODE AGE [DISPATCH] CAUSE; ``namespaces`` puts NAMESPACE first (``-A``) and
    ``wide`` adds the remaining pods, their nodes and who created the TrainJob before CAUSE (``-o wide``)."""
    from rich.text import Text

    mixed = any(not s.managed for s in statuses)  # the DISPATCH column shows when some are not dispatch's
    columns = [Column("NAMESPACE")] if namespaces else []
    columns += [Column("NAME"), Column("STATE"), Column("IDENTITY"), Column("A", right=True), Column("MODE"),
                Column("AGE", right=True)]
    if mixed:
        columns.append(Column("DISPATCH"))
    if wide:
        columns += [Column("PODS", right=True), Column("NODES"), Column("CREATED BY")]
    columns.append(Column("CAUSE", fold=True))
    grid = Grid(columns)
    for s in statuses:
        cells: list[str | Text] = [s.namespace] if namespaces else []
        cells += [
            s.name,
            state_text(s.state.value),
            f"{s.identity.job_id}/{s.identity.submission}" if s.managed else "-",
            str(s.identity.admission) if s.managed else "-",
            (s.mode if not s.queue else f"{s.mode} ({s.queue})") + (f" in {s.cluster}" if s.cluster else ""),
            age(s.created),
        ]
        if mixed:
            cells.append("yes" if s.managed else "no")
        if wide:
            nodes = sorted({p.node for p in s.remaining if p.node})
            cells += [str(len(s.remaining)), ",".join(nodes) or "-", s.created_by or "-"]
        cells.append(Text(str(s.cause)))
        grid.add(cells)
    return grid


def status_table(statuses: Sequence[Status], *, title: str | None = None) -> Table:
    """The status grid as a rich table (the demo's and a terminal's view)."""
    table = status_grid(statuses).table()
    table.title = title
    return table


def pods_grid(pods: Iterable[RemainingPod], *, waited: Callable[[RemainingPod], str] | None = None,
              wide: bool = False) -> Grid:
    columns = [Column("POD"), Column("NODE"), Column("NODE STATE"), Column("PHASE"), Column("TERMINATING"),
               Column("A", right=True)]
    if waited is not None:
        columns.append(Column("WAITING", right=True))
    if wide:
        columns += [Column("FINALIZER"), Column("WHY", fold=True)]
    from rich.text import Text

    grid = Grid(columns)
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
        if wide:
            row += ["held" if p.held else "-", p.why or "-"]
        grid.add(row)
    return grid


def pods_table(pods: Iterable[RemainingPod], *, waited: Callable[[RemainingPod], str] | None = None) -> Table:
    return pods_grid(pods, waited=waited).table()


def wide(state: CliState) -> bool:
    return state.settings.output is Output.WIDE


def print_status(state: CliState, status: Status, *, pods: bool = True, warnings: bool = False) -> None:
    """One object's status; ``pods`` adds its remaining pods under the table, ``warnings`` its warnings (on
    stderr): ``status NAME`` says them, not every command that shows the object on its way (they stay in
    ``-o json``'s ``warnings`` either way)."""

    def human() -> None:
        show(state, status_grid([status], wide=wide(state)))
        if warnings:
            print_warnings(state, status)
        if status.remaining and pods:
            state.out.print()
            state.out.print("[bold]remaining pods[/] (a previous execution may still run):")
            show(state, pods_grid(status.remaining, wide=wide(state)))

    emit(state, status.to_dict(), human, names=trainjob_names(status.name))


def print_warnings(state: CliState, status: Status) -> None:
    from rich.text import Text

    for warning in status.warnings:
        state.err.print(Text(f"warning: {warning}"))


def print_statuses(state: CliState, statuses: Sequence[Status], *, namespaces: bool = False) -> None:
    def human() -> None:
        if not statuses:
            state.err.print("no dispatch objects found (`dispatch status --all` lists every TrainJob)")
            return
        show(state, status_grid(statuses, wide=wide(state), namespaces=namespaces))

    emit(state, {"items": [s.to_dict() for s in statuses]}, human, names=trainjob_names(*(s.name for s in statuses)))


def cessation_dict(name: str, cessation: Cessation) -> dict[str, Any]:
    data = {"name": name, **cessation.to_dict()}
    data["pods"] = [pod_dict(p) for p in cessation.remaining]
    return data


def print_cessation(state: CliState, name: str, cessation: Cessation) -> None:
    def human() -> None:
        from rich.text import Text

        verdict = "[green]ceased[/]" if cessation.ceased else "[red]not ceased[/]"
        state.out.print(f"{name}: {verdict}: ", end="")
        state.out.print(Text(cessation.reason))
        if cessation.remaining:
            show(state, pods_grid(cessation.remaining, wide=wide(state)))

    emit(state, cessation_dict(name, cessation), human, names=trainjob_names(name))
