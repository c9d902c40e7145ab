"""``dispatch.testing`` as a user meets it: the docs' examples (docs/how-to/testing.md) run against the wheel
installed in a fresh virtual environment, outside the checkout (issue 38).

First a plain install (no ``controller`` extra): every example runs, with the shipped roles read from the
package, but the lost-node one, whose ``dispatch.controller.testing.keeper_pass`` says which extra it needs.
Then the extra is installed and that example runs too. The wheel's dependencies come from the package
registry, as a user's do.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .test_examples import blocks

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "how-to" / "testing.md"

pytestmark = pytest.mark.packaging


def isolated(venv: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built as a release builds it: from the files git knows, in a copy of the tree."""
    work = tmp_path_factory.mktemp("wheel")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    tree = work / "src"
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_bytes(source.read_bytes())
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(work / "dist"), str(tree)],
                           capture_output=True, text=True, timeout=900, check=False)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [found] = (work / "dist").glob("*.whl")
    return found


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    installed = isolated(path, str(path / "bin" / "python"), "-m", "pip", "install", "--quiet",
                         "--disable-pip-version-check", str(wheel), cwd=path)
    assert installed.returncode == 0, installed.stderr[-3000:]
    yield path


def examples() -> list[tuple[int, str]]:
    """The page's Python blocks (line, code), but the conftest one: it defines pytest fixtures."""
    found = [(b.line, b.code) for b in blocks(PAGE) if b.lang == "python" and "import pytest" not in b.code]
    assert len(found) >= 6 and any("keeper_pass" in code for _, code in found)
    return found


def run(venv: Path, code: str, where: Path) -> subprocess.CompletedProcess[str]:
    script = where / "example.py"
    script.write_text(code)
    return isolated(venv, str(venv / "bin" / "python"), str(script), cwd=where)


def test_the_testing_examples_run_from_the_wheel(venv: Path, wheel: Path, tmp_path: Path) -> None:
    located = run(venv, "import dispatch.testing._rbac as r; print(r.SHIPPED_RBAC)", tmp_path)
    assert located.returncode == 0 and str(venv) in located.stdout, located  # the package's own copy
    for line, code in examples():
        done = run(venv, code, tmp_path)
        if "keeper_pass" in code:  # the plain install: refused, naming the extra
            assert done.returncode != 0
            assert "pip install 'trainjob-dispatch[controller]'" in done.stderr, done.stderr[-2000:]
            assert "an installed package has no deploy" not in done.stderr
        else:
            assert done.returncode == 0, f"docs/how-to/testing.md:{line}\n{done.stderr[-3000:]}"
    extra = isolated(venv, str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                     "--disable-pip-version-check", f"{wheel}[controller]", cwd=tmp_path)
    assert extra.returncode == 0, extra.stderr[-3000:]
    for line, code in examples():
        if "keeper_pass" in code:
            done = run(venv, code, tmp_path)
            assert done.returncode == 0, f"docs/how-to/testing.md:{line}\n{done.stderr[-3000:]}"
