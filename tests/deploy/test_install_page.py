"""The install page's "Install it on the local testbed, as in a cluster", run as written.

The indented command blocks of that section run in one bash (``set -euo pipefail``) from the repository
root, in order, against the session's testbed. The block's own checks are the user's: ``kubectl wait`` for the
Active condition, ``/readyz``, an authorized scrape, a 401. This test only adds that each printed what the
page says it prints. It ends with the chart installed and no container left running.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.testbed, pytest.mark.packaging]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "how-to" / "install-controller.md"
SECTION = "## Install it on the local testbed, as in a cluster"


def blocks() -> list[str]:
    """The section's code blocks: runs of lines indented by four spaces."""
    text = PAGE.read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    out: list[list[str]] = [[]]
    for line in text[start:end].splitlines():
        if line.startswith("    "):
            out[-1].append(line[4:])
        elif out[-1]:
            out.append([])
    return ["\n".join(b) for b in out if b]


def test_the_section_has_the_three_blocks() -> None:
    got = blocks()
    assert len(got) == 3, got
    assert "scripts/build-image" in got[0] and "kubectl apply --server-side -k deploy/" in got[0]
    assert "dispatch-metrics-reader" in got[1]
    assert "charts/dispatch" in got[2]


def test_the_install_section_works_as_written(testbed_kubeconfig: str, tmp_path: Path) -> None:
    from dispatch.testbed import _container

    why = _container.podman_missing()
    if why and not (os.environ.get("CI") and os.geteuid() == 0):   # in CI, scripts/build-image installs them
        pytest.skip(f"the install runs the controller's image: {why}")
    shim = tmp_path / "bin"
    shim.mkdir()
    # The page's `python` is this interpreter. A script, not a symlink: a venv's python found through a
    # symlink elsewhere finds no pyvenv.cfg beside it, runs as the base interpreter, and loses the venv's
    # packages.
    (shim / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (shim / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    marker = "=== next block of the page ==="
    script = "set -euo pipefail\n" + f"\necho '{marker}'\n".join(blocks())   # one shell, as a person types it
    try:
        got = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=1500)
        assert got.returncode == 0, f"--- stdout\n{got.stdout[-3000:]}\n--- stderr\n{got.stderr[-3000:]}"
        outputs = [o.strip("\n") for o in got.stdout.split(marker + "\n")]
    finally:
        _container.stop("dispatch-controller")
        from dispatch import testbed

        testbed.kubectl("delete", "clusterrolebinding", "scraper", "--ignore-not-found", check=False)
        # deploy/'s guard webhook points at pods that only pretend to run on KWOK: left in place it would deny
        # every later start of a dispatch TrainJob on this testbed (failurePolicy Fail)
        testbed.kubectl("delete", "validatingwebhookconfiguration", "dispatch-guard", "--ignore-not-found",
                        check=False)
        testbed.kubectl("delete", "mutatingwebhookconfiguration", "dispatch-guard", "--ignore-not-found",
                        check=False)
        testbed.kubectl("delete", "serviceaccount", "scraper", "-n", "default", "--ignore-not-found", check=False)
    install, metrics, helm = outputs
    assert "admissioncheck.kueue.x-k8s.io/dispatch condition met" in install
    assert install.splitlines()[-1] == "ok (leader)", install[-500:]
    assert re.search(r"^dispatch_leader 1\.0$", metrics, re.M), metrics
    assert metrics.strip().splitlines()[-1] == "401"
    assert "STATUS: deployed" in helm and "condition met" in helm
