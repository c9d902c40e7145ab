"""A namespace deleted and re-created on the real control plane (issue 25, item 6): the real namespace
controller deletes the submission's record with the namespace, the cluster-scoped floor stays, and the
re-opened submission goes on counting. Run as a ServiceAccount holding exactly the shipped writer roles
(dispatch-writer by a RoleBinding, dispatch-node-reader cluster-wide), as the install docs bind them."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dispatch import Adapter, JobSpec, testbed
from dispatch._identity import floor_name, record_name
from dispatch.testbed.harness import keeper_pass

pytestmark = pytest.mark.testbed

ROOT = Path(__file__).resolve().parents[2]
SPEC = JobSpec(job_id="llama", submission="s1", num_nodes=1)


def _writer(tmp: Path, ns: str) -> str:
    """The namespace, its writer ServiceAccount bound to dispatch-writer there; that account's kubeconfig."""
    testbed.kubectl("create", "namespace", ns)
    testbed.kubectl("-n", ns, "create", "serviceaccount", "writer")
    testbed.kubectl("-n", ns, "create", "rolebinding", "writer", "--clusterrole=dispatch-writer",
                    f"--serviceaccount={ns}:writer")
    token = testbed.kubectl("-n", ns, "create", "token", "writer").stdout.strip()
    cluster = yaml.safe_load(testbed.kubeconfig_path().read_text())["clusters"][0]
    path = tmp / f"{ns}-{uuid.uuid4().hex[:4]}.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": "writer", "user": {"token": token}}],
        "contexts": [{"name": "writer", "context": {"cluster": cluster["name"], "user": "writer", "namespace": ns}}],
        "current-context": "writer"}))
    return str(path)


def _delete_namespace(ns: str, timeout: float = 180.0) -> None:
    """Delete it and wait until the real namespace controller is done (the keeper frees proven pods)."""
    testbed.kubectl("delete", "namespace", ns, "--wait=false")
    deadline = time.monotonic() + timeout
    while testbed.kubectl("get", "namespace", ns, check=False).returncode == 0:
        assert time.monotonic() < deadline, f"namespace {ns} still there after {timeout:.0f}s"
        keeper_pass(ns)
        time.sleep(1)


@pytest.fixture
def ns(testbed_kubeconfig: str) -> Iterator[str]:
    roles = [d for d in yaml.safe_load_all((ROOT / "deploy/base/rbac.yaml").read_text())
             if d and d["kind"] == "ClusterRole"]
    testbed.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(r) for r in roles))
    # the shipped CRDs as this checkout has them (a testbed started earlier may predate the floor's)
    testbed.kubectl("apply", "-f", str(ROOT / "deploy/base/crd.yaml"))
    testbed.kubectl("wait", "--for=condition=Established", "crd/submissionfloors.dispatch.phpboyscout.uk")
    name = f"nsfloor-{uuid.uuid4().hex[:6]}"
    testbed.kubectl("create", "clusterrolebinding", name, "--clusterrole=dispatch-node-reader",
                    f"--serviceaccount={name}:writer")
    try:
        yield name
    finally:
        testbed.kubectl("delete", "clusterrolebinding", name, "--wait=false", check=False)
        testbed.kubectl("delete", "namespace", name, "--wait=false", check=False)
        testbed.kubectl("delete", "submissionfloor", floor_name(name, "llama", "s1"), check=False)


def floor_a(ns: str) -> int | None:
    got = testbed.kubectl("get", "submissionfloor", floor_name(ns, "llama", "s1"), "-o", "json", check=False)
    return int(json.loads(got.stdout)["spec"]["admission"]) if got.returncode == 0 else None


def test_a_namespace_deleted_and_recreated_goes_on_counting_on_the_real_control_plane(
    ns: str, tmp_path: Path
) -> None:
    with Adapter.connect(ns, kubeconfig=_writer(tmp_path, ns)) as a:
        assert a.open(SPEC, hold=False).identity.admission == 1
    assert floor_a(ns) == 1
    _delete_namespace(ns)              # the real namespace controller deletes the record with the rest
    assert floor_a(ns) == 1            # cluster-scoped: it stays
    with Adapter.connect(ns, kubeconfig=_writer(tmp_path, ns)) as a:
        got = testbed.kubectl("-n", ns, "get", "submissionrecord", record_name("llama", "s1"), check=False)
        assert got.returncode != 0     # the namespace is new: no record
        assert a.open(SPEC, hold=False).identity.admission == 2
    assert floor_a(ns) == 2
    # a writer can neither lower nor delete the floor: the CRD's rule and RBAC, on the real API server
    lowered = testbed.kubectl("patch", "submissionfloor", floor_name(ns, "llama", "s1"), "--type", "merge",
                              "-p", '{"spec":{"admission":0}}', check=False)
    assert lowered.returncode != 0 and "A never decreases" in lowered.stderr
    denied = testbed.kubectl("auth", "can-i", "delete", "submissionfloors", f"--as=system:serviceaccount:{ns}:writer",
                             check=False)
    assert denied.stdout.strip() == "no"
