"""placeholder"""
from __future__ import annotations

from rich.console import Console


class DemoFailed(Exception):
    pass
def run_demo(console: Console, *, keep: bool = False, step_timeout: float = 120.0) -> None:
    raise DemoFailed("not yet")
