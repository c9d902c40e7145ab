"""Without the ``controller`` extra, the library and the CLI work; only ``dispatch controller`` needs it.

Each check runs in a fresh interpreter in which structlog, prometheus-client and cryptography cannot be
imported (a meta-path finder refuses them, as a plain ``pip install trainjob-dispatch`` leaves them out).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WITHOUT = textwrap.dedent("""
    import sys
    EXTRA = {"structlog", "prometheus_client", "cryptography"}

    class Absent:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in EXTRA:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Absent())
""")


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT + textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}, timeout=120)


def test_the_library_and_the_cli_import_without_the_controllers_packages() -> None:
    got = run("""
        import dispatch, dispatch.cli, dispatch.errors, dispatch.fence, dispatch.testing
        from dispatch import Adapter, JobSpec, State
        from dispatch.testing import FakeCluster
        cluster = FakeCluster()
        cluster.add_runtime()
        cluster.add_node("node-0")
        with Adapter.connect("default", transport=cluster.transport()) as d:
            d.open(JobSpec(job_id="light", submission="s1"))
            assert d.release("light-s1").admission == 1
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in EXTRA)
        print("loaded:", loaded)
    """)
    assert got.returncode == 0, got.stderr[-2000:]
    assert "loaded: []" in got.stdout


def test_the_cli_helps_and_only_the_controller_command_asks_for_the_extra() -> None:
    got = run("""
        from dispatch.cli import main
        sys.argv = ["dispatch", "--help"]
        main()
    """)
    assert got.returncode == 0 and "controller" in got.stdout, got.stderr[-2000:]
    got = run("""
        from dispatch.cli import main
        sys.argv = ["dispatch", "controller", "--no-leader-elect"]
        main()
    """)
    assert got.returncode == 2, (got.returncode, got.stderr[-2000:])
    assert ("dispatch controller needs the controller extra (structlog is not installed): "
            "pip install 'trainjob-dispatch[controller]'") in got.stderr


def test_the_controller_options_need_no_extra() -> None:
    """``dispatch controller --help`` and its usage errors need only ControllerOptions, which imports
    nothing beyond the standard library and dispatch's names."""
    import ast
    import sys as _sys
    from pathlib import Path as _Path

    import dispatch._controller_options as co

    tree = ast.parse(_Path(co.__file__).read_text())
    imported = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    assert imported <= set(_sys.stdlib_module_names) | {"__future__"}, imported
