"""kubectl's habits on the real control plane, run as users holding exactly the shipped roles: the real API
server's label selectors (and its refusal of a bad one), -A across namespaces (refused to a user bound in one
namespace, as the API server refuses kubectl), -o name/jsonpath on real objects, and ``open --dry-run=server``
through Trainer's real webhooks, storing nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from dispatch import testbed
from dispatch.cli import EXIT_REFUSED, app
from dispatch.testbed.harness import apply_shipped_roles

pytestmark = pytest.mark.testbed

ROOT = Path(__file__).resolve().parents[2]
TJ = "trainjob.trainer.kubeflow.org/"


@dataclass
class Users:
    first: str
    second: str
    writer: str
    """Bound to dispatch-writer in the first namespace only (a RoleBinding), as most users are."""
    second_writer: str
    reader: str
    """Bound to dispatch-reader cluster-wide (a ClusterRoleBinding): may list every namespace."""


def _kubeconfig(tmp: Path, ns: str, sa: str) -> str:
    token = testbed.kubectl("-n", ns, "create", "token", sa).stdout.strip()
    cluster = yaml.safe_load(testbed.kubeconfig_path().read_text())["clusters"][0]
    path = tmp / f"{ns}-{sa}.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": cluster["name"], "user": sa, "namespace": ns}}],
        "current-context": sa}))
    return str(path)


@pytest.fixture
def users(testbed_kubeconfig: str, tmp_path: Path) -> Iterator[Users]:
    tag = uuid.uuid4().hex[:6]
    first, second = f"cli-a-{tag}", f"cli-b-{tag}"
    apply_shipped_roles()
    cluster_bindings = []
    for ns in (first, second):
        testbed.kubectl("create", "namespace", ns)
        testbed.kubectl("-n", ns, "create", "serviceaccount", "writer")
        testbed.kubectl("-n", ns, "create", "rolebinding", "writer", "--clusterrole=dispatch-writer",
                        f"--serviceaccount={ns}:writer")
        cluster_bindings.append(f"{ns}-writer-nodes")
        testbed.kubectl("create", "clusterrolebinding", cluster_bindings[-1], "--clusterrole=dispatch-node-reader",
                        f"--serviceaccount={ns}:writer")
    testbed.kubectl("-n", first, "create", "serviceaccount", "reader")
    for role in ("dispatch-reader", "dispatch-node-reader"):
        cluster_bindings.append(f"{first}-reader-{role}")
        testbed.kubectl("create", "clusterrolebinding", cluster_bindings[-1], f"--clusterrole={role}",
                        f"--serviceaccount={first}:reader")
    try:
        yield Users(first, second, _kubeconfig(tmp_path, first, "writer"), _kubeconfig(tmp_path, second, "writer"),
                    _kubeconfig(tmp_path, first, "reader"))
    finally:
        for name in cluster_bindings:
            testbed.kubectl("delete", "clusterrolebinding", name, "--wait=false", check=False)
        for ns in (first, second):
            testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def run(kubeconfig: str, *args: str) -> Result:
    return CliRunner().invoke(app, ["--kubeconfig", kubeconfig, *args], env={"COLUMNS": "250", "KUBECONFIG": None},
                              catch_exceptions=False)


def trainjobs(ns: str) -> list[str]:
    return testbed.kubectl("-n", ns, "get", "trainjobs", "-o", "name").stdout.split()


def test_kubectl_habits_on_the_real_api_server(users: Users) -> None:
    # --dry-run=server: the real API server and Trainer's webhooks take it, nothing is stored
    dry = run(users.writer, "-o", "yaml", "open", "--job-id", "a", "--submission", "s1", "--dry-run=server")
    assert dry.exit_code == 0, dry.output
    shown = yaml.safe_load(dry.stdout)
    assert shown["metadata"]["name"] == "a-s1" and shown["metadata"].get("creationTimestamp")  # server-made
    assert trainjobs(users.first) == []
    refused = run(users.writer, "open", "--job-id", "a", "--submission", "s1", "--runtime", "no-such-runtime",
                  "--dry-run=server")
    assert refused.exit_code == EXIT_REFUSED, refused.output

    for name, team in (("a-s1", "ml"), ("b-s1", "cv")):
        job, sub = name.split("-")
        opened = run(users.writer, "open", "--job-id", job, "--submission", sub, "--label", f"team={team}")
        assert opened.exit_code == 0, opened.output
    assert run(users.second_writer, "open", "--job-id", "c", "--submission", "s1").exit_code == 0

    # label selectors are the real API server's
    assert run(users.writer, "status", "-l", "team=ml", "-o", "name").stdout == f"{TJ}a-s1\n"
    rows = run(users.writer, "find", "-l", "team in (ml,cv)", "--no-headers").stdout.splitlines()
    assert [r.split()[0] for r in rows] == ["a-s1", "b-s1"]
    bad = run(users.writer, "status", "-l", "team in ml")
    err = " ".join(bad.stderr.split())
    assert bad.exit_code == EXIT_REFUSED and "label selector 'team in ml' refused by the API server" in err, err
    assert "unable to parse requirement" in err  # the real API server's own words follow
    jp = run(users.writer, "status", "-o", "jsonpath={range .items[*]}{.name}={.state}{\"\\n\"}{end}")
    assert jp.stdout == "a-s1=Held\nb-s1=Held\n"

    # -A: a user bound in one namespace is refused by the API server, as kubectl is; a cluster-wide reader is not
    denied = run(users.writer, "status", "-A")
    assert denied.exit_code == EXIT_REFUSED
    assert "cannot list trainjobs.trainer.kubeflow.org" in " ".join(denied.stderr.split())
    every = run(users.reader, "--read-only", "status", "-A")
    assert every.exit_code == 0, every.output
    mine = [r.split()[:2] for r in every.stdout.splitlines() if r.split()[0] in ("NAMESPACE", users.first,
                                                                                   users.second)]
    assert mine == [["NAMESPACE", "NAME"], [users.first, "a-s1"], [users.first, "b-s1"], [users.second, "c-s1"]]
