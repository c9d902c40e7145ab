"""The documentation site builds with warnings as errors, and its references cover every public name.

``mkdocs build --strict`` fails on a broken link, a missing page, a nav entry without a file or a
docstring reference that does not resolve; the checks below then read the built pages.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main

from dispatch.cli import app

ROOT = Path(__file__).resolve().parents[2]
PUBLIC_MODULES = {"dispatch": "reference/api", "dispatch.errors": "reference/errors",
                  "dispatch.testing": "reference/testing", "dispatch.controller.testing": "reference/testing"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, env={**_env(), "PYTHONPATH": str(ROOT / "src")}, check=False,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return out


def _env() -> dict[str, str]:
    return dict(os.environ)


@pytest.mark.parametrize("module", sorted(PUBLIC_MODULES))
def test_every_public_name_has_its_reference_entry(site: Path, module: str) -> None:
    html = (site / PUBLIC_MODULES[module] / "index.html").read_text()
    anchors = set(re.findall(r'id="([\w.]+)"', html))
    names = importlib.import_module(module).__all__
    missing = [name for name in names if f"{module}.{name}" not in anchors]
    assert not missing, f"{module}: no reference entry for {missing}"


def _command_paths() -> list[str]:
    root: Any = typer.main.get_command(app)  # typer's own copy of click: a group has list_commands
    paths = ["dispatch"]
    ctx = typer.Context(root, info_name="dispatch")
    for name in root.list_commands(ctx):
        sub = root.get_command(ctx, name)
        assert sub is not None
        paths.append(f"dispatch {name}")
        if hasattr(sub, "list_commands"):
            sub_ctx = typer.Context(sub, info_name=name, parent=ctx)
            paths.extend(f"dispatch {name} {s}" for s in sub.list_commands(sub_ctx))
    return paths


def test_the_cli_reference_is_every_commands_own_help(site: Path) -> None:
    html = (site / "reference" / "cli" / "index.html").read_text()
    for path in _command_paths():
        slug = path.replace(" ", "-")
        assert f'id="{slug}"' in html, f"no section for `{path}`"
        assert f"Usage: {path} " in html, f"no usage line for `{path}`"
    # the text is the commands' own: an option's help appears as the command defines it
    root: Any = typer.main.get_command(app)
    release = root.get_command(typer.Context(root), "release")
    assert release is not None
    wait_help = next(p for p in release.params if p.name == "wait").help
    assert wait_help and " ".join(wait_help.split()) in " ".join(html.split())


def test_every_page_is_built(site: Path) -> None:
    """A page left out of the nav is a warning, so --strict already fails on it; check the result too."""
    for source in (ROOT / "docs").rglob("*.md"):
        page = source.relative_to(ROOT / "docs").with_suffix("")
        built = site / page.parent / "index.html" if page.name == "index" else site / page / "index.html"
        assert built.exists(), f"docs/{page}.md was not built"


def test_the_api_reference_starts_with_adapter_and_shows_real_label_keys(site: Path) -> None:
    html = (site / "reference" / "api" / "index.html").read_text()
    entries = re.findall(r'id="dispatch\.(\w+)"', html)
    assert entries[:3] == ["Adapter", "AsyncAdapter", "JobSpec"], entries[:5]
    import dispatch

    for name in ("ENROL_LABEL", "LABEL_JOB_ID", "LABEL_ADMISSION", "POD_FINALIZER"):
        value = getattr(dispatch, name)  # the closing quote as Pygments escapes it (2.20: &#39;) or not (2.21)
        assert f"{value}&#39;" in html or f"{value}'" in html, f"{name}'s value is not shown"
    assert "{DOMAIN}" not in html


def test_nothing_is_loaded_from_outside_the_site(site: Path) -> None:
    """No script, stylesheet or image from a CDN: the site works air-gapped."""
    for page in site.rglob("*.html"):
        text = page.read_text()
        outside = re.findall(r'<(?:script|link|img)[^>]+(?:src|href)="(https?:)?//[^"]+"', text)
        assert not outside, f"{page.relative_to(site)} loads from outside: {outside}"
