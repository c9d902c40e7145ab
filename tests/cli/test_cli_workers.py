"""`dispatch admin workers` and `dispatch admin worker-down` on a fake MultiKueue manager (the admin role)."""

from __future__ import annotations

from dispatch.controller.testing import FakeMultiKueue
from dispatch.testing import FakeCluster

from .cli_harness import Cli


def manager() -> tuple[Cli, FakeMultiKueue]:
    cluster = FakeCluster()
    workers = {"worker-1": FakeCluster(), "worker-2": FakeCluster()}
    mk = FakeMultiKueue(cluster, workers)
    mk.install()
    return Cli(cluster), mk


def test_workers_lists_what_kueue_sees_piped_one_row_per_line() -> None:
    cli, mk = manager()
    mk.lose("worker-1")
    out = cli("admin", "workers")
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["WORKER", "KUEUE", "REASON", "LOST", "SINCE", "CONFIRMED", "DOWN"]
    assert lines[1].split()[:3] == ["worker-1", "Active=False", "ClientConnectionFailed"]
    assert lines[1].split()[-1] == "no"
    assert lines[2].split() == ["worker-2", "Active=True", "Active", "-", "no"]


def test_worker_down_confirms_a_lost_worker_and_refuses_a_reachable_one() -> None:
    cli, mk = manager()
    refused = cli("admin", "worker-down", "worker-2")
    assert refused.exit_code == 4, refused.output
    assert "only a worker Kueue has lost (Active=False) can be confirmed down" in refused.output
    mk.lose("worker-1")
    said = cli("admin", "worker-down", "worker-1")
    assert said.exit_code == 0, said.output
    assert "worker worker-1 confirmed down (Kueue lost it at" in said.stdout
    assert "before worker-1 comes back, delete its copies there" in " ".join(said.stdout.split()), said.stdout
    done = cli.json("admin", "worker-down", "worker-1")
    assert done["name"] == "worker-1" and done["confirmedDown"] is True and done["active"] == "False"
    listed = cli.json("admin", "workers")["items"]
    assert [(w["name"], w["confirmedDown"]) for w in listed] == [("worker-1", True), ("worker-2", False)]
    missing = cli("admin", "worker-down", "worker-9")
    assert missing.exit_code != 0 and "multikueuecluster worker-9 not found" in missing.output


def test_worker_down_of_a_removed_worker_makes_the_records_that_remember_it_forget_it() -> None:
    """Issue 35 item 5: no MultiKueueCluster names worker-1 any more, a record remembers it: the command answers
    which records forgot it (it answered NotFound before); a name nothing remembers is still NotFound."""
    from dispatch._identity import new_record

    cli, mk = manager()
    record = new_record("llama", "s1", "llama-s1", admission=3)
    record["spec"]["clusters"] = ["worker-1", "worker-2"]
    mk.manager.server.create("dispatch.phpboyscout.uk", "submissionrecords", "default", record)
    mk.manager.server.delete("kueue.x-k8s.io", "multikueueclusters", "", "worker-1")
    out = cli("admin", "worker-down", "worker-1")
    assert out.exit_code == 0, out.output
    assert "worker worker-1 has no MultiKueueCluster; identity records that forgot it: default/llama/s1" in out.stdout
    spec = mk.manager.server.objects("dispatch.phpboyscout.uk", "submissionrecords", "default")[0]["spec"]
    assert spec["clusters"] == ["worker-2"] and spec["admission"] == 4, spec
    floor = mk.manager.server.objects("dispatch.phpboyscout.uk", "submissionfloors", "")[0]["spec"]
    assert floor["admission"] == 4, floor
    again = cli("admin", "worker-down", "worker-1")
    assert again.exit_code != 0 and "no identity record remembers a worker of that name" in again.output
