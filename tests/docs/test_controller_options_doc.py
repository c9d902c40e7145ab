"""The controller's options table (docs/how-to/install-controller.md) names every option the controller takes."""

from __future__ import annotations

import re
from pathlib import Path

from dispatch._controller_options import options

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "install-controller.md"


def test_the_options_table_lists_every_controller_option() -> None:
    text = PAGE.read_text()
    section = text[text.index("## Options"):]
    section = section[:section.index("\nMetrics:")]
    listed = set(re.findall(r"^\| `(--[a-z-]+)", section, flags=re.M))
    listed |= set(re.findall(r"(--lease-(?:namespace|name))\b", section))
    wanted = {o.flag for o in options() if not o.global_}
    assert wanted - listed == set(), f"options the table does not list: {sorted(wanted - listed)}"
    assert listed - wanted == set(), f"rows for options the controller does not take: {sorted(listed - wanted)}"
