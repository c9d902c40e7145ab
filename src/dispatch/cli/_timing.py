"""Bounds on every interval and timeout the CLI takes.

``--interval 0`` once made ``release --wait`` send over a thousand requests a second to the API server;
``nan`` or ``inf`` slip through a plain minimum (comparisons with nan are false). Each option is checked
against a finite range and refused as a usage error naming the option and the range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


INTERVAL = Seconds(0.1, 3600.0)
"""Between attempts or polls: at most ten a second (each attempt is several requests)."""
TIMEOUT = Seconds(0.0, 7 * 24 * 3600.0)
"""How long to keep waiting: 0 means one attempt; a week at most."""
STEP_TIMEOUT = Seconds(1.0, 24 * 3600.0)
RESYNC = Seconds(1.0, 24 * 3600.0)
