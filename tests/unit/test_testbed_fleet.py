"""The MultiKueue fleet's pure parts (issue 26): its layout beside the single testbed, the settings it passes
to Kueue, the manager's MultiKueue objects, and the refusals of bad input (no cluster is started here; the
real fleet is tests/testbed/test_fleet_testbed.py)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dispatch.testbed import _cluster, fleet
from dispatch.testbed import _manifests as mf

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_layout_is_beside_the_single_testbed_with_its_own_ports(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_TESTBED_DIR", str(tmp_path / "tb"))
    monkeypatch.delenv(fleet.PORT_OFFSET_ENV, raising=False)
    f = fleet.fleet()
    assert [(c.name, c.role, c.port_offset) for c in f.clusters] == [
        ("manager", "manager", 200), ("worker-1", "worker", 300), ("worker-2", "worker", 400)]
    assert [c.runtime_dir for c in f.clusters] == [tmp_path / "tb-manager", tmp_path / "tb-worker-1",
                                                   tmp_path / "tb-worker-2"]
    assert f.cluster("worker-2").kubeconfig == tmp_path / "tb-worker-2" / "kubeconfig"
    assert f.manager.server == "https://127.0.0.1:16643"
    # no port of one cluster is a port of another, nor of the single testbed (offset 0) or a second one (100)
    ports = [p + off for off in (0, 100, 200, 300, 400) for p in mf._BASE_PORTS.values()]
    assert len(ports) == len(set(ports))
    monkeypatch.setenv(fleet.PORT_OFFSET_ENV, "1000")
    assert [c.port_offset for c in fleet.fleet().clusters] == [1000, 1100, 1200]
    monkeypatch.setenv(fleet.PORT_OFFSET_ENV, "x")
    with pytest.raises(ValueError, match=r"DISPATCH_TESTBED_FLEET_PORT_OFFSET must be an integer, not 'x'"):
        fleet.fleet()


def test_unknown_cluster_and_non_worker_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_TESTBED_DIR", str(tmp_path / "tb"))
    with pytest.raises(ValueError, match=r"no cluster 'worker-3' in the fleet \(known: manager, worker-1, worker-2\)"):
        fleet.fleet().cluster("worker-3")
    with pytest.raises(ValueError, match=r"manager is not a worker"):
        fleet.partition("manager")
    with pytest.raises(ValueError, match=r"manager is not a worker"):
        fleet.detach("manager")


def test_a_worker_leaves_and_rejoins_multikueues_config_the_others_in_their_order() -> None:
    """What :func:`fleet.detach` and :func:`fleet.attach` write as the MultiKueueConfig's ``spec.clusters``."""
    assert fleet.with_member(["worker-1", "worker-2"], "worker-1", False) == ["worker-2"]
    assert fleet.with_member(["worker-2"], "worker-1", False) == ["worker-2"]
    assert fleet.with_member(["worker-2"], "worker-1", True) == ["worker-2", "worker-1"]
    assert fleet.with_member(["worker-1", "worker-2"], "worker-1", True) == ["worker-1", "worker-2"]


def test_multikueue_block_checks_its_settings() -> None:
    assert fleet.multikueue_block() == {}
    assert fleet.multikueue_block("30s", "1m30s", "mk-a") == {
        "workerLostTimeout": "30s", "gcInterval": "1m30s", "origin": "mk-a"}
    with pytest.raises(ValueError, match=r"workerLostTimeout must be a Go duration .* not '30'"):
        fleet.multikueue_block(worker_lost_timeout="30")
    with pytest.raises(ValueError, match=r"gcInterval must be a Go duration"):
        fleet.multikueue_block(gc_interval="soon")
    with pytest.raises(ValueError, match=r"origin must be a valid label value, not 'a b'"):
        fleet.multikueue_block(origin="a b")


def test_manager_kueue_configuration_carries_the_block(tmp_path: Path) -> None:
    assert "multiKueue" not in mf.controller_configs(tmp_path)["kueue"]  # the single testbed is as before
    cfg = mf.controller_configs(tmp_path, {"workerLostTimeout": "30s"})["kueue"]
    assert cfg["multiKueue"] == {"workerLostTimeout": "30s"}
    assert "trainer.kubeflow.org/trainjob" in cfg["integrations"]["frameworks"]


def test_manager_multikueue_objects(tmp_path: Path) -> None:
    objs = mf.multikueue_fixtures({"worker-1": "k1", "worker-2": "k2"})
    by = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    sec = by[("Secret", "worker-1-kubeconfig")]
    assert sec["metadata"]["namespace"] == "kueue-system"
    assert base64.b64decode(sec["data"]["kubeconfig"]).decode() == "k1"  # the key MultiKueue reads
    mkc = by[("MultiKueueCluster", "worker-2")]
    assert mkc["spec"]["clusterSource"]["kubeConfig"] == {"locationType": "Secret", "location": "worker-2-kubeconfig"}
    assert by[("MultiKueueConfig", "multikueue")]["spec"]["clusters"] == ["worker-1", "worker-2"]
    ac = by[("AdmissionCheck", "multikueue")]
    assert ac["spec"]["controllerName"] == "kueue.x-k8s.io/multikueue"
    assert ac["spec"]["parameters"]["name"] == "multikueue"
    checks = by[("ClusterQueue", "cq-multikueue")]["spec"]["admissionChecksStrategy"]["admissionChecks"]
    assert checks == [{"name": "multikueue"}]
    both = by[("ClusterQueue", "cq-multikueue-dispatch")]["spec"]["admissionChecksStrategy"]["admissionChecks"]
    assert both == [{"name": "dispatch"}, {"name": "multikueue"}]


def test_embedded_kubeconfig_has_no_file_paths(tmp_path: Path) -> None:
    for f in ("ca.crt", "admin.crt", "admin.key"):
        (tmp_path / f).write_text(f"pem of {f}")
    cfg = yaml.safe_load(mf.embedded_kubeconfig("https://127.0.0.1:16743", tmp_path, "worker-1"))
    cluster = cfg["clusters"][0]["cluster"]
    assert cluster["server"] == "https://127.0.0.1:16743"
    assert "certificate-authority" not in cluster  # MultiKueue refuses file paths
    assert base64.b64decode(cluster["certificate-authority-data"]) == b"pem of ca.crt"
    user = cfg["users"][0]["user"]
    assert set(user) == {"client-certificate-data", "client-key-data"}


def test_trainer_honours_managed_by_from_2_3() -> None:
    assert not _cluster.trainer_honours_managed_by("v2.2.0")
    assert _cluster.trainer_honours_managed_by("v2.3.0")
    assert _cluster.trainer_honours_managed_by("v3.0.1")
    assert not _cluster.trainer_honours_managed_by("garbage")


def test_manager_components_and_unknown_role(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_TESTBED_DIR", str(tmp_path))
    (tmp_path / "state.json").write_text(json.dumps({"bin": "x", "stack": "s", "role": "manager"}))
    assert _cluster._component_names() == list(_cluster.MANAGER_COMPONENTS)
    (tmp_path / "state.json").write_text(json.dumps({"bin": "x", "stack": "s", "role": "manager", "trainer": "off"}))
    assert "trainer" not in _cluster._component_names()
    (tmp_path / "state.json").unlink()
    monkeypatch.setenv(_cluster.ROLE_ENV, "boss")
    with pytest.raises(ValueError, match=r"unknown testbed role 'boss'"):
        _cluster._component_names()


def test_multikueue_env_must_be_a_json_object(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_cluster.MULTIKUEUE_ENV, "[1]")
    with pytest.raises(ValueError, match=r"must be a JSON object"):
        _cluster._multikueue_from_env()
    monkeypatch.setenv(_cluster.MULTIKUEUE_ENV, "{")
    with pytest.raises(ValueError, match=r"is not JSON"):
        _cluster._multikueue_from_env()
    monkeypatch.setenv(_cluster.MULTIKUEUE_ENV, '{"workerLostTimeout": "30s"}')
    assert _cluster._multikueue_from_env() == {"workerLostTimeout": "30s"}


def test_cli_refuses_fleet_settings_without_clusters_and_bad_durations(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": SRC, "DISPATCH_TESTBED_DIR": str(tmp_path / "tb")}
    for argv, said in (
        (["up", "--worker-lost-timeout", "30s"], "are for the fleet: add --clusters"),
        (["up", "--clusters", "--worker-lost-timeout", "half a minute"], "workerLostTimeout must be a Go duration"),
        (["partition", "worker-9"], "no cluster 'worker-9'"),
    ):
        proc = subprocess.run([sys.executable, "-m", "dispatch.testbed", *argv], env=env, capture_output=True,
                              text=True, check=False)
        assert proc.returncode == 2, proc.stderr
        assert said in proc.stderr
    assert not (tmp_path / "tb-manager").exists()  # refused before anything was written
