"""The image recipe of docs/how-to/install-controller.md ("Build and push the image"), archive path, for real.

scripts/build-image builds the image; `podman save` writes the archive; the testbed's real node's own
containerd imports it (`ctr -n k8s.io images import`), and a pod on that node runs it with
`imagePullPolicy: Never`, under deploy/'s pod and container security contexts (no user id: the real kubelet
must accept the image's own numeric user for `runAsNonRoot`, as on a platform that assigns none), to the
end of `--help`.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch import testbed as tb

pytestmark = [pytest.mark.testbed, pytest.mark.packaging]

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "how-to" / "install-controller.md"


def recipe() -> list[str]:
    """The archive block's commands, as the page shows them."""
    text = DOCS.read_text()
    start = text.index("<!-- example: cluster imports an image on a real node -->")
    block = text[start:].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_page_shows_the_archive_recipe() -> None:
    assert recipe() == ['podman save --format docker-archive -o dispatch-controller.tar "$image"',
                        "ctr -n k8s.io images import dispatch-controller.tar"]


def test_the_archive_imported_on_a_real_node_runs_as_deployed(testbed_kubeconfig: str, tmp_path: Path) -> None:
    from dispatch.testbed import _container, _node, realnode

    why = _container.podman_missing()
    if why and not (os.environ.get("CI") and os.geteuid() == 0):
        pytest.skip(f"the image needs podman: {why}")
    if realnode.problem() is not None:
        pytest.skip(f"the testbed has no real node: {realnode.problem()}")
    image = _container.build_image()
    save, imp = recipe()
    subprocess.run(["bash", "-c", f"image={image}; {save}"], cwd=tmp_path, check=True)
    assert imp.startswith("ctr -n k8s.io ")
    _node.ctr(*imp.split()[3:-1], str(tmp_path / "dispatch-controller.tar"), timeout=120)   # the node's containerd
    assert image in _node.ctr("images", "ls", "-q").stdout.split()

    [dep] = [d for d in yaml.safe_load_all((ROOT / "deploy" / "base" / "deployment.yaml").read_text())
             if d and d["kind"] == "Deployment"]
    shipped = dep["spec"]["template"]["spec"]
    name, ns = f"image-{uuid.uuid4().hex[:6]}", "default"
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
           "spec": {"nodeName": realnode.node_name(), "restartPolicy": "Never",
                    "securityContext": shipped["securityContext"],
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "controller", "image": image, "imagePullPolicy": "Never",
                                    "args": ["--help"],
                                    "securityContext": shipped["containers"][0]["securityContext"]}]}}
    assert "runAsUser" not in pod["spec"]["securityContext"]
    tb.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
    try:
        phase, end = "", time.monotonic() + 120
        while time.monotonic() < end and phase not in ("Succeeded", "Failed"):
            phase = tb.kubectl("-n", ns, "get", "pod", name, "-o", "jsonpath={.status.phase}").stdout
            time.sleep(0.5)
        logs = tb.kubectl("-n", ns, "logs", name, check=False).stdout
        status = tb.kubectl("-n", ns, "get", "pod", name, "-o", "jsonpath={.status.containerStatuses}").stdout
        assert phase == "Succeeded", (phase, status, logs[-2000:])
        assert logs.startswith("usage: dispatch-controller"), logs[:500]
    finally:
        tb.kubectl("-n", ns, "delete", "pod", name, "--wait=false", check=False)
