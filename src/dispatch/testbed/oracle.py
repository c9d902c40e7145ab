"""The process oracle: what real processes wrote, and whether two executions of one submission overlapped.

The testbed's other checker reads pod objects, which say what components believed. This one reads what the
real node's workload processes appended to their oracle file (``testbed/images/workload``): one line per
tick naming the job, submission, admission number A, pod, pid and time, with START, TERM and EXIT events.
The promise holds only if, for every submission, no two processes with different A were alive at the same
moment. Processes of one execution (one A, several nodes) may of course run together.

A process is alive from its START line to its EXIT line. Without an EXIT line (SIGKILL, a node stopped
under it) it counts as alive while its pid still names it on the host (pid and start time), and as ended
at its last line once it is gone. A pid that cannot be looked up on the host (the pod did not share the
host's pid namespace) counts as alive: the oracle never guesses a process dead.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

PREFIX = "dispatch-oracle/1"
"""First field of every oracle line (the format's version)."""
EVENTS = ("START", "TICK", "TERM", "EXIT")
_UNSET = "-"


@dataclass(frozen=True)
class Record:
    """One oracle line."""

    job_id: str
    submission: str
    admission: str
    """A as the process's environment said it (``DISPATCH_ADMISSION``; ``-`` if unset)."""
    pod: str
    pid: int
    pidns: str
    """The pid namespace's inode: equal to the host's when the pod shares it (``hostPID``)."""
    start_ticks: str
    """The process's start time in clock ticks since boot: with ``pid``, it names one process."""
    run: str
    """A random id the process chose at start: its identity in the file."""
    seq: int
    ms: int
    """Wall-clock time of the line, in Unix milliseconds (all processes share the host's clock)."""
    event: str
    code: int | None = None
    """EXIT's exit code."""
    where: str = ""
    """``file:line`` it came from."""


def _unescape(v: str) -> str:
    """Undo the writer's %XX escapes (space, '=', '%', tab, newline)."""
    if "%" not in v:
        return v
    out, i = [], 0
    while i < len(v):
        if v[i] == "%" and i + 3 <= len(v):
            try:
                out.append(chr(int(v[i + 1:i + 3], 16)))
                i += 3
                continue
            except ValueError:
                pass
        out.append(v[i])
        i += 1
    return "".join(out)


def parse_line(line: str, where: str = "") -> Record | None:
    """The record of one line; None for a line that is not an oracle line. A malformed oracle line raises
    ``ValueError`` naming it: the writer makes each line with one write, so a torn line is a real fault."""
    fields = line.split()
    if not fields or fields[0] != PREFIX:
        return None
    kv: dict[str, str] = {}
    for f in fields[1:]:
        k, sep, v = f.partition("=")
        if not sep:
            raise ValueError(f"malformed oracle line{f' at {where}' if where else ''}: {line!r}")
        kv[k] = _unescape(v)
    try:
        event = kv["event"]
        if event not in EVENTS:
            raise ValueError(event)
        return Record(
            job_id=kv["job"], submission=kv["submission"], admission=kv["a"], pod=kv["pod"], pid=int(kv["pid"]),
            pidns=kv.get("pidns", _UNSET), start_ticks=kv.get("start", _UNSET), run=kv["run"], seq=int(kv["seq"]),
            ms=int(kv["ms"]), event=event, code=int(kv["code"]) if "code" in kv else None, where=where,
        )
    except (KeyError, ValueError) as e:
        raise ValueError(f"malformed oracle line{f' at {where}' if where else ''} ({e}): {line!r}") from None


def read(path: Path | str) -> list[Record]:
    """Every record of an oracle file, or of every ``*.log`` file in a directory (file by file, in order).

    A last line without its newline is being written right now and is left out; any other bad line raises.
    """
    p = Path(path)
    files = sorted(p.glob("*.log")) if p.is_dir() else [p]
    out: list[Record] = []
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except FileNotFoundError:
            continue
        lines = text.split("\n")
        complete = lines[:-1]  # the part after the last newline is incomplete (or empty)
        for n, line in enumerate(complete, 1):
            rec = parse_line(line, f"{f}:{n}")
            if rec is not None:
                out.append(rec)
    return out


# --------------------------------------------------------------------------------------------- the host


def _host_pidns() -> str:
    """This process's pid namespace: pids of records written in it can be looked up in our /proc (the
    real node's pods share the host's with ``hostPID``, as the testbed and its tests do)."""
    try:
        return os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")
    except OSError:
        return ""


def pid_alive(pid: int, start_ticks: str | int | None = None) -> bool:
    """True if ``pid`` runs on this host (not a zombie) and, when ``start_ticks`` is given, is the process
    that started then (not a later one that reused the pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    rest = stat.rsplit(")", 1)[1].split()
    if rest[0] in ("Z", "X"):
        return False
    return start_ticks in (None, _UNSET) or rest[19] == str(start_ticks)


def host_alive(rec: Record) -> bool:
    """Whether the process that wrote ``rec`` may still run: looked up when its pid belongs to our pid
    namespace (the host's); assumed alive when it does not (such a pid cannot be checked from here)."""
    if rec.pidns == _UNSET or rec.pidns != _host_pidns():
        return True
    return pid_alive(rec.pid, rec.start_ticks)


# --------------------------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class Process:
    """One process's life as its lines tell it."""

    run: str
    job_id: str
    submission: str
    admission: str
    pod: str
    pid: int
    started_ms: int
    """Its START line (its first line if START is missing)."""
    last_ms: int
    ended_ms: int | None
    """Its EXIT line; its last line if it has none and is gone; None while it may still run."""
    exit_code: int | None
    termed_ms: int | None
    """Its first TERM line (SIGTERM received), if any."""
    lines: int

    @property
    def alive(self) -> bool:
        return self.ended_ms is None

    def __str__(self) -> str:
        end = "alive" if self.ended_ms is None else f"until {self.ended_ms}"
        code = f", exit {self.exit_code}" if self.exit_code is not None else ""
        return f"A={self.admission} pid {self.pid} in pod {self.pod} (from {self.started_ms} {end}{code})"


def processes(records: Iterable[Record], alive: Callable[[Record], bool] = host_alive) -> list[Process]:
    """The processes the records tell of, by start time. ``alive(last record)`` says whether a process
    without an EXIT line may still run (default: look it up on this host)."""
    by_run: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_run[r.run].append(r)
    out = []
    for run, recs in by_run.items():
        recs.sort(key=lambda r: (r.seq, r.ms))
        first, last = recs[0], recs[-1]
        start = next((r for r in recs if r.event == "START"), first)
        exit_ = next((r for r in recs if r.event == "EXIT"), None)
        term = next((r for r in recs if r.event == "TERM"), None)
        if exit_ is not None:
            ended: int | None = exit_.ms
        else:
            ended = None if alive(last) else last.ms
        out.append(Process(run=run, job_id=first.job_id, submission=first.submission, admission=first.admission,
                           pod=first.pod, pid=first.pid, started_ms=start.ms, last_ms=last.ms, ended_ms=ended,
                           exit_code=exit_.code if exit_ is not None else None,
                           termed_ms=term.ms if term is not None else None, lines=len(recs)))
    out.sort(key=lambda p: (p.started_ms, p.run))
    return out


@dataclass(frozen=True)
class Overlap:
    """Two processes of one submission, with different A, alive at the same time."""

    job_id: str
    submission: str
    first: Process
    second: Process
    since_ms: int
    until_ms: int | None
    """When the earlier of the two ended; None while both may still run."""

    def __str__(self) -> str:
        until = "still both alive" if self.until_ms is None else f"until {self.until_ms}"
        return (f"submission {self.job_id}/{self.submission}: A={self.first.admission} (pid {self.first.pid}, "
                f"pod {self.first.pod}) and A={self.second.admission} (pid {self.second.pid}, pod "
                f"{self.second.pod}) alive at once from {self.since_ms} {until}")


def overlaps(records: Iterable[Record] | Sequence[Process],
             alive: Callable[[Record], bool] = host_alive) -> list[Overlap]:
    """Every pair of processes of one (job id, submission) with different A whose lives intersect (both
    ends included: the oracle is conservative). Empty means the promise held for what the file shows."""
    items = list(records)
    procs = [p for p in items if isinstance(p, Process)]
    if len(procs) != len(items):
        procs = processes([r for r in items if isinstance(r, Record)], alive)
    by_sub: dict[tuple[str, str], list[Process]] = defaultdict(list)
    for p in procs:
        by_sub[(p.job_id, p.submission)].append(p)
    out = []
    for (job, sub), group in sorted(by_sub.items()):
        for a, b in combinations(sorted(group, key=lambda p: (p.started_ms, p.run)), 2):
            if a.admission == b.admission:
                continue
            a_end = a.ended_ms if a.ended_ms is not None else float("inf")
            b_end = b.ended_ms if b.ended_ms is not None else float("inf")
            if a.started_ms <= b_end and b.started_ms <= a_end:
                ends = [e for e in (a.ended_ms, b.ended_ms) if e is not None]
                out.append(Overlap(job, sub, a, b, max(a.started_ms, b.started_ms), min(ends) if ends else None))
    return out


def assert_no_overlap(source: Path | str | Iterable[Record], alive: Callable[[Record], bool] = host_alive) -> None:
    """Raise ``AssertionError`` naming every overlap found in an oracle file, directory or record set."""
    records = read(source) if isinstance(source, (str, Path)) else list(source)
    found = overlaps(records, alive)
    if found:
        raise AssertionError("the process oracle saw two executions at once:\n  " + "\n  ".join(map(str, found)))
