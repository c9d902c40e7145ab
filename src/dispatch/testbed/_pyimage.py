"""The real node's Python image: this machine's interpreter, the stdlib it needs and ``dispatch.fence``.

The node's workload image is a static Go program with no interpreter, and the fence is a Python module. Rather
than a second implementation of the fence's protocol in Go (which the real node would then test in place of
the one users import), the image carries the interpreter that runs these tests and exactly the files a
fenced training process loads: found by running :mod:`._fence_workload` once here (one claim, one commit)
and reading ``sys.modules`` and the process's mapped shared objects, then adding each object's loader-visible
names (``ldd``), the dynamic loader, ``os.py`` (the interpreter's landmark for its prefix) and the whole
``encodings`` package (the locale decides which codec starts first). Files keep their paths on this machine,
so the interpreter finds its prefix and libraries as it does here; ``dispatch`` goes to ``/app``.

Built from the sources it runs (the ``dispatch`` package this process imported), in a few seconds, each
time a test asks for it (:func:`dispatch.testbed.realnode.python_image`, cached while the node lives), so it
never lags the code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from dispatch.testbed import _oci

IMAGE = "localhost/dispatch-testbed/python:1"
APP = "/app"
SCRIPT = f"{APP}/fence_workload.py"


def _package_dir() -> Path:
    import dispatch

    return Path(dispatch.__file__).resolve().parent


def _ldd(path: str) -> dict[str, str]:
    """Where the dynamic loader finds each object ``path`` needs: {path in the image: file here}."""
    exe = shutil.which("ldd")
    if exe is None:
        raise RuntimeError("ldd is not installed: the Python image needs it to find the interpreter's libraries")
    out = subprocess.run([exe, path], capture_output=True, text=True, timeout=30)
    found: dict[str, str] = {}
    for line in out.stdout.splitlines():
        m = re.match(r"\s*(\S+) => (/\S+) \(", line) or re.match(r"\s*(/\S+) \(", line)
        if m is None:
            if "not found" in line:
                raise RuntimeError(f"ldd {path}: {line.strip()}")
            continue
        where = m.group(m.lastindex or 1)
        found[where] = os.path.realpath(where)
    return found


def trace(python: str = sys.executable) -> dict[str, object]:
    """Run the fenced workload once here with ``python -S``; what it loaded (see ``_fence_workload.trace``)."""
    pkg = _package_dir()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "trace.json"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(pkg.parent),
               "PYTHONDONTWRITEBYTECODE": "1"}
        done = subprocess.run([python, "-S", str(pkg / "testbed" / "_fence_workload.py"), "--trace", str(out)],
                              capture_output=True, text=True, env=env, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"tracing the fenced workload failed: {done.stderr[-2000:]}")
        traced: dict[str, object] = json.loads(out.read_text())
    return traced


def files(python: str = sys.executable) -> dict[str, Path]:
    """Every file of the image: {path in the image: file here}."""
    traced = trace(python)
    pkg = _package_dir()
    executable = os.path.realpath(str(traced["executable"]))
    major, minor = (int(v) for v in traced["version"])  # type: ignore[attr-defined]
    stdlib = Path(str(traced["prefix"])) / "lib" / f"python{major}.{minor}"
    out: dict[str, Path] = {executable: Path(executable)}
    objects = [executable, *(str(s) for s in traced["shared"])]  # type: ignore[attr-defined]
    for obj in objects:
        out[obj] = Path(os.path.realpath(obj))
        for where, real in _ldd(obj).items():
            out[where] = Path(real)
    for module in traced["modules"]:  # type: ignore[attr-defined]
        path = Path(str(module))
        if path.suffix != ".py" or not path.is_file():
            continue
        if pkg in path.parents:
            out[f"{APP}/dispatch/{path.relative_to(pkg).as_posix()}"] = path
        elif stdlib in path.parents:
            out[str(path)] = path
    for extra in [stdlib / "os.py", *sorted((stdlib / "encodings").glob("*.py"))]:
        out[str(extra)] = extra
    out.pop(f"{APP}/dispatch/testbed/_fence_workload.py", None)  # traced as the script, not as a module
    out[SCRIPT] = pkg / "testbed" / "_fence_workload.py"
    return out


def entrypoint(python: str = sys.executable) -> list[str]:
    """The image's command: its interpreter, without ``site`` (no site-packages in the image), on the script."""
    return [os.path.realpath(python), "-S", SCRIPT]


def archive(out: Path, arch: str, content: dict[str, Path] | None = None,
            python: str = sys.executable) -> tuple[str, int]:
    """Write the image's OCI archive to ``out`` (of ``content``, default :func:`files`); returns its manifest
    digest and its files' total size."""
    content = files(python) if content is None else content
    unique: dict[str, Path] = {}
    links: dict[str, str] = {}
    for where, src in sorted(content.items()):
        first = next((w for w, s in unique.items() if s.samefile(src)), None)
        if first is None:
            unique[where] = src
        else:
            links[where] = first  # one file under several names (a library's soname and its real name)
    env = ("PATH=/usr/local/bin:/usr/bin:/bin", f"PYTHONPATH={APP}", "PYTHONDONTWRITEBYTECODE=1",
           "PYTHONUNBUFFERED=1")
    digest = _oci.archive(out, IMAGE, entrypoint(python), unique, links=links, env=env, arch=arch)
    return digest, sum(p.stat().st_size for p in unique.values())
