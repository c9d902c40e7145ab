"""``release --wait``: retry until admitted, showing live which pods remain and for how long.

Between attempts it follows watches of the object's pods and TrainJob, so the next attempt comes within
one watch event of the last pod going; it polls every ``interval`` (doubling) only while a watch is down.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from rich.console import Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from .._adapter import Adapter, Following
from .._records import Identity, RemainingPod
from ..errors import DispatchError, PodsRemain, Unreachable
from ._errors import Interrupts
from ._output import duration, pods_table
from ._state import CliState


def release_once(adapter: Adapter, name: str) -> Identity:
    """One release; a Ctrl-C during it takes effect once it has returned (never between its writes)."""
    with Interrupts().deferred():
        return adapter.release(name)


def release_wait(
    state: CliState,
    adapter: Adapter,
    name: str,
    *,
    timeout: float,
    interval: float,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> Identity:
    """Retry ``release`` on Unreachable (PodsRemain included) until it admits or ``timeout`` passes.

    Refusals end the wait at once. Between attempts nothing is in flight, so Ctrl-C there (or, deferred,
    during an attempt) leaves nothing half-written: each attempt is the library's conditioned write.
    With ``sleep`` given (tests) attempts are paced by it alone; else by the object's watched changes.
    """
    clock = clock or time.monotonic
    following: Following | None = None
    if sleep is None:
        try:
            following = adapter.follow(name, interval=interval)
        except DispatchError:
            following = None   # the first attempt reports a refusal; an unreachable API is polled
    try:
        if following is not None:
            # a follower waits for the next change, up to the deadline (it polls only while a watch is down)
            return _attempts(state, adapter, name, timeout=timeout, clock=clock, pause=following.changed,
                             interval=None)
        return _attempts(state, adapter, name, timeout=timeout, clock=clock, pause=sleep or time.sleep,
                         interval=interval)
    finally:
        if following is not None:
            with contextlib.suppress(DispatchError):
                following.close()


def _attempts(state: CliState, adapter: Adapter, name: str, *, timeout: float, interval: float | None,
              clock: Callable[[], float], pause: Callable[[float], object]) -> Identity:
    start = clock()
    deadline = start + timeout
    first_seen: dict[str, float] = {}
    remaining: tuple[RemainingPod, ...] = ()
    last = ""
    attempt = 0

    admitted: Identity | None = None

    def render() -> RenderableType:
        now = clock()
        head = Text.from_markup(
            f"[bold]releasing {escape(name)}[/]: attempt {attempt}, waited {duration(now - start)} "
            f"of {timeout:g}s"
        )
        parts: list[RenderableType] = [head]
        if admitted is not None:
            parts.append(Text(f"admitted as {admitted}", style="green"))
        elif remaining:
            parts.append(Text("not admitted: pods of the previous execution may still run", style="yellow"))
            parts.append(pods_table(remaining, waited=lambda p: duration(now - first_seen.get(p.name, now))))
        elif last:
            parts.append(Text(last, style="yellow"))
        return Group(*parts)

    # On a terminal the view is redrawn in place; in a log, one line per attempt whose outcome changed.
    interactive = state.err.is_terminal
    printed: list[str] = []

    def show(live: Live | None) -> None:
        if live is not None:
            live.update(render(), refresh=True)
            return
        now = clock()
        if admitted is not None:
            line = f"attempt {attempt}: admitted as {admitted}"
        elif remaining:
            pods = ", ".join(
                f"{p.describe()} {'Terminating' if p.terminating else p.phase} for "
                f"{duration(now - first_seen.get(p.name, now))}"
                for p in remaining
            )
            line = f"attempt {attempt}: not admitted, pods remain: {pods}"
        else:
            line = f"attempt {attempt}: not admitted: {last}"
        if admitted is not None:
            key = "admitted"
        elif remaining:
            key = ", ".join(f"{p.describe()} {p.terminating}" for p in remaining)
        else:
            key = last
        if not printed or printed[-1] != key:
            printed.append(key)
            state.err.print(f"releasing {escape(name)}: {escape(line)}", highlight=False)

    live = Live(render(), console=state.err, refresh_per_second=4, transient=False) if interactive else None
    with live if live is not None else contextlib.nullcontext():
        while True:
            attempt += 1
            try:
                identity = release_once(adapter, name)
            except PodsRemain as exc:
                last = str(exc)
                try:
                    remaining = adapter.inspect(name).remaining
                except Unreachable:
                    remaining = ()
            except Unreachable as exc:
                last = str(exc)
                remaining = ()
            else:
                admitted = identity
                show(live)
                return identity
            now = clock()
            names = {p.name for p in remaining}
            for gone in set(first_seen) - names:
                del first_seen[gone]
            for n in names:
                first_seen.setdefault(n, now)
            show(live)
            if now >= deadline:
                raise Unreachable(
                    f"timed out after {timeout:g}s waiting to release {name}: {last}",
                    reason="Timeout",
                )
            left = max(0.0, deadline - now)
            pause(left if interval is None else min(interval, left))
