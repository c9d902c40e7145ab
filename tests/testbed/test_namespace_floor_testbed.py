"""A namespace deleted and re-created on the real control plane (issue 25, item 6): the real namespace
controller deletes the submission's record with the namespace, the cluster-scoped floor stays, and the
re-opened submission goes on counting. Run as a ServiceAccount holding exactly the shipped writer roles
(dispatch-writer by a RoleBinding, dispatch-node-reader cluster-wide), as the install docs bind them."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dispatch import Adapter, Forbidden, JobSpec, Refused, testbed
from dispatch import _kube as k
from dispatch._api import SUBMISSION_FLOORS
from dispatch._identity import ADMISSION_LIMIT, floor_name, new_floor, record_name
from dispatch.testbed.harness import apply_shipped_roles, floors_of_this_tree, keeper_pass

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
    apply_shipped_roles()
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


def test_a_writer_of_one_namespace_cannot_create_or_raise_the_floor_of_another_on_the_real_control_plane(
    testbed_kubeconfig: str, tmp_path: Path
) -> None:
    """The breaking schedule of issue 25's second round, on the real API server with this tree's CRDs and the
    shipped ``dispatch-floors`` policy: a writer bound in namespace "a" only creates the floor of a submission
    of "b" near the top, squats its name, and raises it once b's owner ran it. Each is refused; b's writer
    runs its submission as usual; a floor raised to the top (by b's own writer) stalls it, naming the way out."""
    apply_shipped_roles()
    suffix = uuid.uuid4().hex[:6]
    a, b = f"floora-{suffix}", f"floorb-{suffix}"
    for ns in (a, b):
        testbed.kubectl("create", "clusterrolebinding", ns, "--clusterrole=dispatch-node-reader",
                        f"--serviceaccount={ns}:writer")
    writers = {ns: _writer(tmp_path, ns) for ns in (a, b)}
    theirs = floor_name(b, "llama", "s1")

    def in_force() -> bool:
        got = testbed.kubectl("--kubeconfig", writers[a], "create", "--dry-run=server", "-f", "-",
                              input=json.dumps(new_floor(b, "llama", "s1", 1)), check=False)
        return got.returncode != 0 and "dispatch-floors" in got.stderr

    async def scenario() -> None:
        admin = k.Kube.connect(namespace=a, kubeconfig=testbed_kubeconfig)
        try:
            async with floors_of_this_tree(admin, in_force):
                await asyncio.to_thread(story)
        finally:
            await admin.aclose()

    def story() -> None:
        with Adapter.connect(a, kubeconfig=writers[a]) as mine:
            kube = mine._async.core.kube
            with pytest.raises(Forbidden) as denied:
                mine._run(kube.create(SUBMISSION_FLOORS, new_floor(b, "llama", "s1", ADMISSION_LIMIT)))
            print("DENIED (create b's floor from a):", denied.value)
            assert f"a floor of namespace {b} is written only by whoever may create submissionrecords in {b}" \
                in str(denied.value)
            squat = new_floor(a, "llama", "s1", 5)
            squat["metadata"] = {**squat["metadata"], "name": theirs}
            with pytest.raises(Refused) as squatted:
                mine._run(kube.create(SUBMISSION_FLOORS, squat))
            print("DENIED (squat b's floor's name):", squatted.value)
            assert "a floor's name is the namespace it names" in str(squatted.value)
        with Adapter.connect(b, kubeconfig=writers[b]) as owner:
            assert owner.open(SPEC, hold=False).identity.admission == 1   # the shipped writer role still works
        with Adapter.connect(a, kubeconfig=writers[a]) as mine:
            with pytest.raises(Forbidden) as denied:
                mine._run(mine._async.core.kube.merge_patch(SUBMISSION_FLOORS, theirs, {"spec": {"admission": 7}}))
            print("DENIED (raise b's floor from a):", denied.value)
            assert f"written only by whoever may patch submissionrecords in {b}" in str(denied.value)
        assert floor_a(b) == 1
        # b's own writer may raise its floors (same tenant), never past the top; a submission there stalls,
        # naming the way out
        raised = testbed.kubectl("--kubeconfig", writers[b], "patch", "submissionfloor", theirs, "--type=merge", "-p",
                                 json.dumps({"spec": {"admission": ADMISSION_LIMIT + 1}}), check=False)
        print("DENIED (above the highest A):", raised.stderr.strip())
        assert raised.returncode != 0 and f"less than or equal to {ADMISSION_LIMIT}" in raised.stderr
        testbed.kubectl("--kubeconfig", writers[b], "create", "-f", "-",
                        input=json.dumps(new_floor(b, "llama", "s2", ADMISSION_LIMIT)))
        with Adapter.connect(b, kubeconfig=writers[b]) as owner:
            owner.open(JobSpec(job_id="llama", submission="s2", num_nodes=1))
            with pytest.raises(Refused, match=r"`dispatch admin forget llama s2 --yes`") as stalled:
                owner.release("llama-s2")
            print("STALLED:", stalled.value)

    try:
        asyncio.run(scenario())
    finally:
        for ns in (a, b):
            testbed.kubectl("delete", "clusterrolebinding", ns, "--wait=false", check=False)
            testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)
            for submission in ("s1", "s2"):
                testbed.kubectl("delete", "submissionfloor", floor_name(ns, "llama", submission), check=False)
