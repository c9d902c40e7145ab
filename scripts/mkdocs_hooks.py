"""MkDocs hooks for the documentation site.

The command-line reference is the ``--help`` of every ``dispatch`` command, rendered at build time
from the typer app itself, so the page cannot drift from the commands. A page asks for it with the
marker ``<!-- cli-reference -->``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer.main

MARKER = "<!-- cli-reference -->"
WIDTH = 100


def commands(cmd: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    """Every command under ``cmd`` (itself first), depth first, in the order ``--help`` lists them.

    Typed loosely: typer ships its own copy of click, so a group is whatever has ``list_commands``.
    """
    yield ctx, cmd
    if hasattr(cmd, "list_commands"):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            sub_ctx = sub.make_context(name, [], parent=ctx, resilient_parsing=True)
            yield from commands(sub, sub_ctx)


def cli_reference() -> str:
    """The reference as Markdown: one section per command with its help as plain text."""
    from dispatch.cli import app

    root = typer.main.get_command(app)
    ctx = root.make_context("dispatch", [], resilient_parsing=True, terminal_width=WIDTH, max_content_width=WIDTH)
    parts = []
    for sub_ctx, cmd in commands(root, ctx):
        path = sub_ctx.command_path
        summary = cmd.get_short_help_str(limit=WIDTH)
        parts.append(f"## `{path}`\n\n{summary}\n\n```text\n{cmd.get_help(sub_ctx).rstrip()}\n```\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    return markdown
