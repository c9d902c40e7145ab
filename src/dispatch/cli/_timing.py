"""Bounds on every interval and timeout the CLI takes.

``--interval 0`` once made ``release --wait`` send over a thousand requests a second to the API server;
``nan`` or ``inf`` slip through a plain minimum (comparisons with nan are false). Each option is checked
against a finite range and refused as a usage error naming the option and the range.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import typer


@dataclass(frozen=True)
class Seconds:
    """A typer callback accepting a finite number of seconds in ``[low, high]``."""

    low: float
    high: float

    @property
    def range(self) -> str:
        return f"{self.low:g} to {self.high:g}"

    def __call__(self, value: float) -> float:
        if not math.isfinite(value) or not self.low <= value <= self.high:
            raise typer.BadParameter(f"must be {self.range} seconds (got {value:g})")
        return value

    def option(self, flag: str, help: str) -> Any:
        """The option ``flag`` held to these bounds, its help ending with them."""
        return typer.Option(flag, metavar="SECONDS", callback=self, help=f"{help} ({self.range}).")


INTERVAL = Seconds(0.1, 3600.0)
"""Between attempts or polls: at most ten a second (each attempt is several requests)."""
TIMEOUT = Seconds(0.0, 7 * 24 * 3600.0)
"""How long to keep waiting: 0 means one attempt; a week at most."""
STEP_TIMEOUT = Seconds(1.0, 24 * 3600.0)


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
MAX_DURATION = 7 * 24 * 3600.0


def parse_duration(value: str) -> float:
    """Seconds from kubectl's duration words: ``30``, ``1.5s``, ``2m``, ``1h30m``, ``250ms``; ``0`` is none.

    Anything else (a negative, a unit kubectl does not take, nan, past a week) raises ValueError naming
    the value, so the option is a usage error, never read as something else."""
    text = value.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        seconds = float(text)
    else:
        parts = _DURATION_PART.findall(text)
        if not text or "".join(f"{n}{u}" for n, u in parts) != text:
            raise ValueError(f"{value!r} is not a duration: give seconds (30) or a duration such as 30s, 2m, 1h")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds > MAX_DURATION:
        raise ValueError(f"{value!r} is past the longest duration taken, a week")
    return seconds
