"""Readable progress for the testbed build: one line per component, with elapsed time and an estimate.

A cold build compiles Kubernetes and four controllers from Go modules (about 25 minutes on 2 cores); what
the Go tool prints is hundreds of "go: downloading" lines nobody can read. build.sh writes that to a log
file and announces each step on stderr as ``[testbed build] <event> ...``; this module turns those events
into lines a person can follow, with estimates from the build times measured for each stack.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TextIO

EVENT_PREFIX = "[testbed build] "
REAL_NODE_PARTS = frozenset({"kubelet", "pause", "workload"})
"""Components of the real node, cached apart from the control plane's."""
TAIL_LINES = 25

# Display names of the versions.env keys, in the order the header lists them.
_COMPONENTS = (
    ("K8S_VERSION", "Kubernetes"),
    ("ETCD_VERSION", "etcd"),
    ("KWOK_VERSION", "KWOK"),
    ("JOBSET_VERSION", "JobSet"),
    ("TRAINER_VERSION", "Trainer"),
    ("KUEUE_VERSION", "Kueue"),
)


def fmt_duration(seconds: float) -> str:
    """``42s``, ``5m07s``, ``1h02m``: short enough for a progress line."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def read_build_times(path: Path) -> dict[str, float]:
    """Known build seconds per component from a stack's ``build-times`` file (``NAME SECONDS`` lines)."""
    out: dict[str, float] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split("#", 1)[0].split()
        if len(parts) == 2:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                continue
    return out


def tail(path: Path, n: int = TAIL_LINES) -> list[str]:
    """The last ``n`` lines of ``path`` (none if it cannot be read)."""
    try:
        with path.open(errors="replace") as f:
            return [line.rstrip("\n") for line in deque(f, maxlen=n)]
    except OSError:
        return []


@dataclass(eq=False)
class BuildProgress:
    """Renders build.sh's events; every other stderr line is kept for the error message.

    ``tty`` switches on a line rewritten in place while a component compiles (the elapsed time ticks);
    ``out=None`` keeps quiet but still records the events. Without a terminal (CI logs, tests) each
    component gets one line when it starts and one when it ends, so a log shows where a build stood and
    how long each part took.
    """

    out: TextIO | None
    stack: str
    versions: dict[str, str]
    estimates: dict[str, float]
    _: KW_ONLY
    tty: bool = False
    clock: Callable[[], float] = time.monotonic
    t0: float = field(init=False)
    plan: list[str] = field(init=False, default_factory=list)
    log: Path | None = field(init=False, default=None)
    current: str | None = field(init=False, default=None)
    current_t0: float = field(init=False, default=0.0)
    done: dict[str, float] = field(init=False, default_factory=dict)
    failed: str | None = field(init=False, default=None)
    up_to_date: bool = field(init=False, default=False)
    other: list[str] = field(init=False, default_factory=list)
    _live: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.t0 = self.clock()

    # ------------------------------------------------------------------ events

    def feed(self, line: str) -> None:
        """Handle one stderr line of the build."""
        line = line.rstrip("\n")
        if not line.startswith(EVENT_PREFIX):
            if line.strip():
                self.other.append(line)
            return
        event, _, rest = line[len(EVENT_PREFIX):].partition(" ")
        args = rest.split()
        if event == "log" and rest:
            self.log = Path(rest.strip())
        elif event == "plan" and args:
            self.plan = args[1:]
            self._header()
        elif event == "start" and args:
            self.current, self.current_t0 = args[0], self.clock()
            self._line(self._starting_line(args[0], 0.0), final=not self.tty)
        elif event == "done" and len(args) >= 2:
            secs = _float(args[1], self.clock() - self.current_t0)
            self.done[args[0]] = secs
            self.current = None
            self._line(self._done_line(args[0], secs), final=True)
        elif event == "failed" and args:
            secs = _float(args[1] if len(args) > 1 else "", self.clock() - self.current_t0)
            self.failed, self.current = args[0], None
            reason = " ".join(args[2:]).replace("exit=", "exit ") or "failed"
            self._line(f"  {self._counter(args[0])} {args[0]:<24} FAILED after {fmt_duration(secs)} ({reason})",
                       final=True)
        elif event == "up-to-date":
            self.up_to_date = True

    def tick(self) -> None:
        """Rewrite the live line (terminal only) with the current component's elapsed time."""
        if self.tty and self.current is not None:
            self._line(self._starting_line(self.current, self.clock() - self.current_t0), final=False)

    def finish(self, ok: bool) -> None:
        """Closing line: total time, or where the Go tool's output is and its last lines."""
        if self.up_to_date or not self.plan:
            return
        total = fmt_duration(self.clock() - self.t0)
        if ok:
            self._line(f"testbed: stack {self.stack} built in {total}; later runs reuse it and start in seconds",
                       final=True)
            return
        where = f" ({self.failed})" if self.failed else ""
        self._line(f"testbed: build of stack {self.stack} failed{where} after {total}", final=True)
        if self.log is not None:
            lines = tail(self.log)
            self._line(f"testbed: last {len(lines)} lines of {self.log}:", final=True)
            for t in lines:
                self._line(f"    {t}", final=True)

    # ------------------------------------------------------------------ text

    def estimate_total(self) -> float:
        return sum(self.estimates.get(c, 0.0) for c in self.plan)

    def _header(self) -> None:
        names = ", ".join(f"{label} {self.versions[k]}" for k, label in _COMPONENTS if k in self.versions)
        est = self.estimate_total()
        how_long = f"about {_minutes(est)} on 2 cores" if est else "tens of minutes on 2 cores"
        if self.plan and set(self.plan) <= REAL_NODE_PARTS:  # the control plane is built; only these are new
            k8s = self.versions.get("K8S_VERSION", "")
            self._line(f"testbed: building the real node's {', '.join(self.plan)} for stack {self.stack} "
                       f"(Kubernetes {k8s}) from Go modules", final=True)
        else:
            self._line(f"testbed: first build of stack {self.stack} ({names}) from Go modules", final=True)
        self._line(
            f"testbed: {len(self.plan)} components, {how_long}; later runs reuse the binaries and start in seconds",
            final=True,
        )
        if self.log is not None:
            self._line(f"testbed: the Go tool's output goes to {self.log}", final=True)

    def _counter(self, name: str) -> str:
        n = len(self.plan)
        i = self.plan.index(name) + 1 if name in self.plan else len(self.done) + 1
        return f"[{i}/{n}]"

    def _est(self, name: str) -> str:
        e = self.estimates.get(name)
        return f"~{fmt_duration(e)}" if e else "no estimate"

    def _left(self) -> float:
        """Usual time of what is left, scaled by how this build compares so far (a warm Go build cache
        makes every step several times faster than a cold one, a busy machine slower)."""
        left = sum(self.estimates.get(c, 0.0) for c in self.plan if c not in self.done)
        took = sum(t for c, t in self.done.items() if self.estimates.get(c))
        usual = sum(self.estimates[c] for c in self.done if self.estimates.get(c))
        pace = min(max(took / usual, 0.05), 3.0) if usual and took else 1.0
        return left * pace

    def _starting_line(self, name: str, elapsed: float) -> str:
        return f"  {self._counter(name)} {name:<24} building  {fmt_duration(elapsed)} (usually {self._est(name)})"

    def _done_line(self, name: str, secs: float) -> str:
        left = self._left()
        rest = f", about {_minutes(left)} left" if left else ""
        total = fmt_duration(self.clock() - self.t0)
        return (f"  {self._counter(name)} {name:<24} built     {fmt_duration(secs)} (usually {self._est(name)}); "
                f"{total} so far{rest}")

    def _line(self, text: str, *, final: bool) -> None:
        if self.out is None:
            return
        if self.tty:
            self.out.write("\r\033[K" + text + ("\n" if final else ""))
            self._live = not final
        else:
            self.out.write(text + "\n")
        self.out.flush()


def _float(s: str, default: float) -> float:
    try:
        return float(s)
    except ValueError:
        return default


def _minutes(seconds: float) -> str:
    m = max(1, round(seconds / 60))
    return f"{m} min"
