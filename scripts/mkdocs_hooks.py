"""MkDocs hooks for the documentation site.

The command-line reference is the ``--help`` of every ``dispatch`` command, rendered at build time
from the typer app itself, so the page cannot drift from the commands. A page asks for it with the
marker ``<!-- cli-reference -->``.

Diagrams are text in the pages (a fenced block ```` ```bob title="..." ````, readable as it is in the
repository) and are drawn as SVG at build time by svgbob, whose binary the ``markdown-svgbob`` wheel
ships: no network, no browser, no CDN. Each becomes a ``<figure class="diagram">`` with an inline SVG
image, its title as the caption and alt text.
"""

from __future__ import annotations

import base64
import html
import re
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


DIAGRAM = re.compile(r'^```bob title="(?P<title>[^"]+)"\n(?P<body>.*?)^```$', re.MULTILINE | re.DOTALL)


def diagram(match: re.Match[str]) -> str:
    """One ```` ```bob ```` block as a figure holding its SVG (svgbob, run from the markdown-svgbob wheel)."""
    from markdown_svgbob import wrapper

    svg = wrapper.text2svg(match["body"])
    # svgbob sizes the canvas by what it draws, not by quoted (escaped) text: widen it to the longest line
    # (8 px per column, as svgbob lays text out), or text right of the last line is cut off
    columns = max(len(line) for line in match["body"].splitlines())
    width = int(re.search(rb'width="(\d+)"', svg)[1])  # type: ignore[index]
    svg = svg.replace(f'width="{width}"'.encode(), f'width="{max(width, columns * 8 + 16)}"'.encode(), 1)
    title = html.escape(match["title"])
    data = base64.b64encode(svg).decode()
    return (f'<figure class="diagram"><img src="data:image/svg+xml;base64,{data}" alt="{title}">'
            f"<figcaption>{title}</figcaption></figure>")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    return DIAGRAM.sub(diagram, markdown)
