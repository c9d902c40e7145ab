"""Reading a fenced location's log directly from its store, to check the fence against what was written."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dispatch.fence import FenceStore


@dataclass(frozen=True)
class Entry:
    seq: int
    kind: str
    admission: int
    step: int
    data: str
    name: str = ""


def read_log(store: FenceStore) -> list[Entry]:
    """Every entry, in order; the numbers must have no gap (the next missing one ends the log)."""
    entries: list[Entry] = []
    while (body := store.read(f"log/{len(entries) + 1:012d}")) is not None:
        raw: dict[str, Any] = json.loads(body)
        entries.append(Entry(len(entries) + 1, raw["kind"], raw["admission"], raw.get("step", -1),
                             raw.get("data", ""), raw.get("name", "")))
    return entries


def counting(entries: list[Entry]) -> list[Entry]:
    """The commits that count by the fence's rule: no claim of a higher A before them."""
    out = []
    for i, entry in enumerate(entries):
        higher = [e for e in entries[:i] if e.kind == "claim" and e.admission > entry.admission]
        if entry.kind == "commit" and not higher:
            out.append(entry)
    return out
