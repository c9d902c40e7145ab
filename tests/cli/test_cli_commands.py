"""Every command, option and exit code of ``dispatch``, against the fake cluster."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch import CONTROLLER_NAME, LABEL_ADMISSION, Status
from dispatch._adapter import Following
from dispatch._controller_options import ControllerOptions
from dispatch._trainer import identity_env
from dispatch.cli import EXIT_NOT_CEASED, EXIT_REFUSED, EXIT_RETRY, EXIT_USAGE

from .cli_harness import Cli

STATUS_KEYS = {
    "name", "namespace", "state", "identity", "cause", "mode", "queue", "created", "remaining", "resourceVersion",
    "managed", "createdBy",
    "warnings", "cluster",
}
POD_KEYS = {"name", "node", "nodeState", "phase", "terminating", "admission", "deletionTimestamp", "held", "why",
            "cluster"}


def trainjob(cli: Cli, name: str) -> dict[str, Any]:
    obj = cli.cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", name)
    assert isinstance(obj, dict)
    return obj


def check_status_schema(data: dict[str, Any]) -> None:
    assert set(data) == STATUS_KEYS
    assert set(data["identity"]) == {"jobId", "submission", "admission"}
    assert set(data["cause"]) == {"reason", "detail"}
    assert isinstance(data["identity"]["admission"], int)
    for pod in data["remaining"]:
        assert set(pod) == POD_KEYS


# ------------------------------------------------------------------------------------------------ help


def test_help_documents_exit_codes(cli: Cli) -> None:
    result = cli("--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for phrase in ("0 success", "2 usage error", "3 retryable", "PodsRemain", "4 refused", "Unreachable", "Refused"):
        assert phrase in text
    for command in ("open", "release", "hold", "close", "status", "ceased", "wait", "logs", "controller",
                    "testbed", "demo"):
        assert command in result.stdout


@pytest.mark.parametrize(
    "command", ["open", "release", "hold", "close", "status", "ceased", "wait", "logs", "controller", "demo"]
)
def test_every_command_has_help_with_exit_codes(cli: Cli, command: str) -> None:
    result = cli(command, "--help")
    assert result.exit_code == 0
    assert "Exit codes" in result.stdout


def test_version(cli: Cli) -> None:
    result = cli("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("dispatch ")


def test_no_arguments_shows_usage(cli: Cli) -> None:
    result = cli()
    assert result.exit_code in (0, EXIT_USAGE)
    assert "Usage" in result.output


def test_unknown_option_is_a_usage_error(cli: Cli) -> None:
    result = cli("status", "--bogus")
    assert result.exit_code == EXIT_USAGE
    assert cli.connected == []


# ------------------------------------------------------------------------------------------------ open


def test_open_from_flags(cli: Cli) -> None:
    data = cli.json(
        "open", "--job-id", "llama", "--submission", "s1", "--image", "train:1", "--command", "python train.py",
        "--arg", "--epochs", "--arg", "3", "--nodes", "1", "-r", "cpu=2", "-r", "memory=4Gi", "-e", "A=1",
        "-l", "team=ml", "--grace-period", "5",
    )
    check_status_schema(data)
    assert data["name"] == "llama-s1"
    assert data["state"] == "Held"
    assert data["identity"] == {"jobId": "llama", "submission": "s1", "admission": 0}
    assert data["mode"] == "plain"
    tj = trainjob(cli, "llama-s1")
    assert tj["spec"]["suspend"] is True
    trainer = tj["spec"]["trainer"]
    assert trainer["image"] == "train:1"
    assert trainer["command"] == ["python", "train.py"]
    assert trainer["args"] == ["--epochs", "3"]
    assert trainer["numNodes"] == 1
    assert trainer["resourcesPerNode"]["requests"] == {"cpu": "2", "memory": "4Gi"}
    assert trainer["env"] == [{"name": "A", "value": "1"}, *identity_env()]  # then the identity, from the labels
    assert tj["metadata"]["labels"]["team"] == "ml"


def test_open_table_output(cli: Cli) -> None:
    result = cli("open", "--job-id", "llama", "--submission", "s1")
    assert result.exit_code == 0, result.output
    assert "opened llama-s1" in result.stdout
    for word in ("NAME", "STATE", "IDENTITY", "AGE", "CAUSE", "Held", "llama/s1"):
        assert word in result.stdout


def test_open_from_spec_file_with_flags_overriding(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "jobId: llama\nsubmission: s1\nimage: a:1\ncommand: python train.py\nnumNodes: 2\n"
        "resourcesPerNode: {cpu: 1}\nenv: {X: '1'}\nlabels: {team: ml}\n"
    )
    data = cli.json("open", "-f", str(spec), "--submission", "s2", "-r", "memory=1Gi")
    assert data["name"] == "llama-s2"
    trainer = trainjob(cli, "llama-s2")["spec"]["trainer"]
    assert trainer["image"] == "a:1"
    assert trainer["command"] == ["python", "train.py"]
    assert trainer["numNodes"] == 2
    assert trainer["resourcesPerNode"]["requests"] == {"cpu": "1", "memory": "1Gi"}


def test_open_with_node_selector_and_pod_annotations(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("jobId: pin\nsubmission: s1\nnodeSelector: {kubernetes.io/hostname: node-1}\n")
    cli.json("open", "-f", str(spec), "--pod-annotation", "example.com/a=1", "--no-hold")
    cli.cluster.settle()
    pods = cli.cluster.pods("pin-s1")
    assert [p["spec"]["nodeName"] for p in pods] == ["node-1"]
    assert pods[0]["metadata"]["annotations"] == {"example.com/a": "1"}


def test_open_from_stdin(cli: Cli) -> None:
    result = cli("-o", "json", "open", "-f", "-", input="job_id: llama\nsubmission: s9\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["name"] == "llama-s9"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("jobId: llama\nsubmission: s1\nbogus: 1\n", "unknown key(s)"),
        ("- a\n- b\n", "must be a mapping"),
        ("jobId: [unclosed\n", "not valid YAML"),
        ("jobId: llama\nsubmission: s1\nnumNodes: two\n", "numNodes must be an integer"),
        ("jobId: llama\nsubmission: s1\nenv: [a]\n", "env must be a mapping"),
        ("jobId: llama\n", "missing --submission"),
    ],
)
def test_open_bad_spec_file_is_a_usage_error(cli: Cli, tmp_path: Path, text: str, words: str) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    result = cli("open", "-f", str(spec))
    assert result.exit_code == EXIT_USAGE
    assert words in " ".join(result.stderr.split())
    assert cli.connected == []


def test_open_missing_spec_file(cli: Cli, tmp_path: Path) -> None:
    result = cli("open", "-f", str(tmp_path / "nope.yaml"))
    assert result.exit_code == EXIT_USAGE
    assert "cannot read spec file" in " ".join(result.stderr.split())


def test_open_bad_pair_is_a_usage_error(cli: Cli) -> None:
    result = cli("open", "--job-id", "a", "--submission", "b", "-r", "cpu")
    assert result.exit_code == EXIT_USAGE
    assert "KEY=VALUE" in result.stderr


def test_open_invalid_input_is_refused_naming_the_field(cli: Cli) -> None:
    result = cli("open", "--job-id", "Bad Id!", "--submission", "s1")
    assert result.exit_code == EXIT_REFUSED
    assert "job_id" in result.stderr
    assert "hint:" in result.stderr
    assert "Traceback" not in result.output


def test_open_no_hold_admits(cli: Cli) -> None:
    data = cli.json("open", "--job-id", "llama", "--submission", "s1", "--no-hold")
    assert data["state"] == "Running"
    assert data["identity"]["admission"] == 1
    cli.cluster.settle()
    pods = cli.cluster.pods("llama-s1")
    assert [p["metadata"]["labels"][LABEL_ADMISSION] for p in pods] == ["1"]


def test_open_twice_is_refused(cli: Cli) -> None:
    assert cli("open", "--job-id", "llama", "--submission", "s1").exit_code == 0
    result = cli("open", "--job-id", "llama", "--submission", "s1")
    assert result.exit_code == EXIT_REFUSED
    assert "already exists" in result.stderr
    assert "new --submission" in result.stderr


def test_open_unknown_runtime(cli: Cli) -> None:
    result = cli("open", "--job-id", "llama", "--submission", "s1", "--runtime", "nope")
    assert result.exit_code == EXIT_REFUSED
    assert "nope not found" in result.stderr
    assert "--runtime" in result.stderr


def test_open_with_queue_is_kueue_mode(cli: Cli) -> None:
    data = cli.json("open", "--job-id", "llama", "--submission", "s1", "--queue", "lq", "--priority", "high")
    assert data["mode"] == "kueue"
    assert data["queue"] == "lq"
    labels = trainjob(cli, "llama-s1")["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "lq"
    assert labels["kueue.x-k8s.io/priority-class"] == "high"


def test_read_only_refuses_writes(cli: Cli) -> None:
    result = cli("--read-only", "open", "--job-id", "llama", "--submission", "s1")
    assert result.exit_code == EXIT_REFUSED
    assert "read-only" in result.stderr
    assert "drop --read-only" in result.stderr
    assert cli.cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", "llama-s1") is None


# --------------------------------------------------------------------------------------------- release


def test_release_admits_and_is_idempotent(cli: Cli) -> None:
    assert cli("open", "--job-id", "llama", "--submission", "s1").exit_code == 0
    first = cli.json("release", "llama-s1")
    assert first == {"name": "llama-s1", "admitted": True,
                     "identity": {"jobId": "llama", "submission": "s1", "admission": 1}}
    again = cli.json("release", "llama-s1")
    assert again == first
    result = cli("release", "llama-s1")
    assert "admitted llama-s1: execution llama/s1#1 (A=1)" in result.stdout


def test_release_with_pods_remaining_exits_3_naming_them(cli: Cli, running: Callable[[], str]) -> None:
    name = running()
    assert cli("hold", name).exit_code == 0
    cli.cluster.settle()
    pod = cli.cluster.pods(name)[0]["metadata"]["name"]
    result = cli("release", name)
    assert result.exit_code == EXIT_RETRY
    err = " ".join(result.stderr.split())
    assert pod in err
    assert "may still run" in err
    assert "release --wait" in err
    assert trainjob(cli, name)["spec"]["suspend"] is True


def test_release_wait_retries_until_the_pods_go(cli: Cli, running: Callable[[], str],
                                                monkeypatch: pytest.MonkeyPatch, keeper: Callable[[], object]) -> None:
    name = running()
    assert cli("hold", name).exit_code == 0
    cli.cluster.settle()
    pod = cli.cluster.pods(name)[0]["metadata"]["name"]
    # the grace period (30s) passes while the CLI waits: the kubelet's progress wakes it through its watches
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            cli.cluster.advance(2.0)
            cli.cluster.step()
            time.sleep(0.01)

    ticker = threading.Thread(target=tick, daemon=True)
    original = Following.changed

    def changed(self: Following, timeout: float) -> bool:
        if not ticker.is_alive() and not stop.is_set():
            ticker.start()
        return original(self, timeout)

    monkeypatch.setattr(Following, "changed", changed)
    try:
        result = cli("-o", "json", "release", name, "--wait", "--interval", "0.1", "--timeout", "60")
    finally:
        stop.set()
        if ticker.is_alive():
            ticker.join()
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["identity"]["admission"] == 2
    err = " ".join(result.stderr.split())
    assert f"not admitted, pods remain: {pod} on node-0 (Ready=True) Terminating for" in err
    assert "admitted as llama/s1#2" in err
    cli.cluster.settle()
    keeper()  # the controller frees the ended pod (the writer role may not patch pods: issue 25)
    assert {p["metadata"]["labels"][LABEL_ADMISSION] for p in cli.cluster.pods(name)} == {"2"}


def test_release_wait_times_out_with_exit_3(cli: Cli, running: Callable[[], str]) -> None:
    name = running()
    node = cli.cluster.pods(name)[0]["spec"]["nodeName"]
    cli.cluster.freeze_node(node)
    assert cli("hold", name).exit_code == 0
    cli.cluster.settle()
    result = cli("release", name, "--wait", "--interval", "0.1", "--timeout", "0.3")
    assert result.exit_code == EXIT_RETRY
    err = " ".join(result.stderr.split())
    assert "timed out after 0.3s" in err
    assert "Ready=Unknown" in err
    assert trainjob(cli, name)["spec"]["suspend"] is True
    cli.cluster.taint_out_of_service(node)


def test_release_wait_retries_connection_failures(cli: Cli) -> None:
    assert cli("open", "--job-id", "llama", "--submission", "s1").exit_code == 0
    cli.cluster.server.inject(status="connect", times=4)
    result = cli("release", "llama-s1", "--wait", "--interval", "0.1", "--timeout", "30")
    assert result.exit_code == 0, result.output
    assert "A=1" in result.stdout


def test_release_wait_stops_at_a_refusal(cli: Cli) -> None:
    result = cli("release", "nothere", "--wait", "--interval", "0.1", "--timeout", "30")
    assert result.exit_code == EXIT_REFUSED
    assert "not found" in result.stderr


def test_ctrl_c_during_release_wait_leaves_nothing_half_written(
    cli: Cli, running: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    name = running()
    assert cli("hold", name).exit_code == 0
    cli.cluster.settle()
    before = trainjob(cli, name)

    def interrupt(self: object, seconds: float) -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr("dispatch._adapter.Following.changed", interrupt)   # between attempts
    result = cli("release", name, "--wait", "--interval", "1", "--timeout", "60")
    assert result.exit_code == 130
    assert "nothing was left half-written" in result.stderr
    after = trainjob(cli, name)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


# ------------------------------------------------------------------------------------------ hold/close


def test_hold_shows_remaining_pods(cli: Cli, running: Callable[[], str]) -> None:
    name = running()
    data = cli.json("hold", name)
    check_status_schema(data)
    assert data["state"] == "Held"
    cli.cluster.settle()
    data = cli.json("status", name)
    assert data["cause"]["reason"] == "PodsRemain"
    assert data["remaining"][0]["terminating"] is True
    assert data["remaining"][0]["nodeState"] == "Ready=True"
    result = cli("status", name)
    assert "remaining pods" in result.stdout
    assert data["remaining"][0]["name"] in result.stdout


def test_close(cli: Cli, running: Callable[[], str]) -> None:
    name = running()
    data = cli.json("close", name)
    assert data["name"] == name
    assert data["closed"] is True
    assert data["remaining"], "its pod is still there right after the delete"
    assert set(data["remaining"][0]) == {*POD_KEYS, "description"}
    assert data["remaining"][0]["description"].startswith(data["remaining"][0]["name"] + " on ")
    cli.cluster.advance(60)
    cli.cluster.settle()
    result = cli("close", name)
    assert result.exit_code == EXIT_REFUSED


def test_close_table(cli: Cli) -> None:
    assert cli("open", "--job-id", "llama", "--submission", "s1").exit_code == 0
    result = cli("close", "llama-s1")
    assert result.exit_code == 0
    assert "closed llama-s1" in result.stdout


# ---------------------------------------------------------------------------------------------- status


def test_status_json_matches_the_library_exactly(cli: Cli, running: Callable[[], str]) -> None:
    name = running()
    cli("hold", name)
    cli.cluster.settle()
    data = cli.json("status", name)
    check_status_schema(data)
    from dispatch import Adapter

    with Adapter.connect("default", transport=cli.cluster.transport()) as adapter:
        expected: Status = adapter.inspect(name)
    assert data == expected.to_dict()


def test_status_table_carries_the_cause_verbatim(cli: Cli, running: Callable[[], str]) -> None:
    name = running()
    data = cli.json("status", name)
    result = cli("status", name)
    assert result.exit_code == 0
    line = next(line for line in result.stdout.splitlines() if line.startswith(name))
    assert "Running" in line
    assert "llama/s1" in line
    assert f"{data['cause']['reason']}: {data['cause']['detail']}" in line


def test_status_yaml(cli: Cli, running: Callable[[], str]) -> None:
    name = running()
    result = cli("status", name, "-o", "yaml")
    assert result.exit_code == 0
    data = yaml.safe_load(result.stdout)
    check_status_schema(data)
    assert data["identity"]["admission"] == 1


def test_status_find_with_filters(cli: Cli) -> None:
    for job, sub in (("llama", "s1"), ("llama", "s2"), ("mistral", "s1")):
        assert cli("open", "--job-id", job, "--submission", sub).exit_code == 0
    assert cli("release", "llama-s2").exit_code == 0
    everything = cli.json("status")
    assert set(everything) == {"items"}
    assert [s["name"] for s in everything["items"]] == ["llama-s1", "llama-s2", "mistral-s1"]
    for item in everything["items"]:
        check_status_schema(item)
    assert [s["name"] for s in cli.json("status", "--job-id", "llama")["items"]] == ["llama-s1", "llama-s2"]
    assert [s["name"] for s in cli.json("status", "--submission", "s1")["items"]] == ["llama-s1", "mistral-s1"]
    assert [s["name"] for s in cli.json("status", "--state", "running")["items"]] == ["llama-s2"]
    held = cli.json("status", "--state", "Held", "--state", "Queued")["items"]
    assert [s["name"] for s in held] == ["llama-s1", "mistral-s1"]
    table = cli("status")
    assert table.exit_code == 0
    assert "mistral-s1" in table.stdout


def test_status_find_empty(cli: Cli) -> None:
    assert cli.json("status") == {"items": []}
    result = cli("status")
    assert result.exit_code == 0
    assert "no dispatch objects found" in result.stderr


def test_status_name_and_filters_is_a_usage_error(cli: Cli) -> None:
    result = cli("status", "x", "--job-id", "y")
    assert result.exit_code == EXIT_USAGE


def test_status_bad_state_is_a_usage_error(cli: Cli) -> None:
    assert cli("status", "--state", "Sleeping").exit_code == EXIT_USAGE


def test_status_not_found(cli: Cli) -> None:
    result = cli("status", "nothere")
    assert result.exit_code == EXIT_REFUSED
    assert "nothere not found" in result.stderr
    assert "hint:" in result.stderr


# ---------------------------------------------------------------------------------------------- ceased


def test_ceased_through_a_frozen_node_and_the_out_of_service_taint(cli: Cli, running: Callable[[], str],
                                                                 keeper: Callable[[], object]) -> None:
    name = running()
    node = cli.cluster.pods(name)[0]["spec"]["nodeName"]
    cli.cluster.freeze_node(node)
    assert cli("hold", name).exit_code == 0
    cli.cluster.settle()
    not_yet = cli("-o", "json", "ceased", name)
    assert not_yet.exit_code == EXIT_NOT_CEASED  # the answer is the exit code, as grep -q's is
    data = json.loads(not_yet.stdout)
    assert set(data) == {"name", "ceased", "reason", "remaining", "pods", "ends"}
    assert data["ceased"] is False
    assert [(e["proof"], e["finalizer"]) for e in data["ends"]] == [("unproven", True)]
    assert "Ready=Unknown" in data["remaining"][0]
    assert data["pods"][0]["nodeState"] == "Ready=Unknown"
    table = cli("ceased", name)
    assert table.exit_code == EXIT_NOT_CEASED
    assert "not ceased" in table.stdout
    status = cli.json("status", name)
    assert "Ready=Unknown" in status["cause"]["detail"]
    cli.cluster.taint_out_of_service(node)
    data = cli.json("ceased", name)
    assert data["ceased"] is True
    cli.cluster.settle()
    keeper()  # the controller frees the pod its node's taint proves ended
    assert cli.json("release", name)["identity"]["admission"] == 2


def test_ceased_works_read_only(cli: Cli, running: Callable[[], str]) -> None:
    name = running()
    result = cli("--read-only", "-o", "json", "ceased", name)
    assert result.exit_code == EXIT_NOT_CEASED
    assert json.loads(result.stdout)["ceased"] is False


def test_ceased_exit_codes_are_documented_like_grep_q(cli: Cli) -> None:
    text = " ".join(cli("ceased", "--help").stdout.split())
    assert "0 ceased, 1 not ceased" in text
    assert "Exit codes, as grep -q's: 0 ceased; 1 not ceased" in text
    assert cli("ceased").exit_code == EXIT_USAGE  # an error is never 0 or 1
    assert cli("ceased", "Not_A_Name").exit_code == EXIT_REFUSED


# ------------------------------------------------------------------------------------------------ wait


def test_wait_for_running(cli: Cli) -> None:
    assert cli("open", "--job-id", "llama", "--submission", "s1").exit_code == 0
    assert cli("release", "llama-s1").exit_code == 0
    data = cli.json("wait", "llama-s1", "--for", "Running", "--timeout", "5", "--interval", "0.1")
    assert data["state"] == "Running"


def test_wait_times_out_with_exit_3(cli: Cli) -> None:
    assert cli("open", "--job-id", "llama", "--submission", "s1").exit_code == 0
    result = cli("wait", "llama-s1", "--for", "running", "--for", "succeeded", "--timeout", "0.2",
                 "--interval", "0.1")
    assert result.exit_code == EXIT_RETRY
    assert "timed out" in result.stderr
    assert "llama-s1: Held: Held: hold in force" in result.stderr  # progress line


def test_wait_needs_for(cli: Cli) -> None:
    assert cli("wait", "x").exit_code == EXIT_USAGE


# ------------------------------------------------------------------------------------------------ logs


def test_logs(cli: Cli, running: Callable[[], str]) -> None:
    import httpx2

    name = running()
    pod = cli.cluster.pods(name)[0]["metadata"]["name"]
    seen: list[str] = []

    async def handle(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/log"):
            seen.append(f"{request.url.path}?{request.url.query!s}")
            return httpx2.Response(200, text="step 1 loss 2.0\nstep 2 loss 1.5\n")
        response: httpx2.Response = await cli.cluster.server.handle(request)
        return response

    cli.transport = lambda: httpx2.MockTransport(handle)
    result = cli("logs", name, "--node", "0")
    assert result.exit_code == 0, result.output
    assert result.stdout == "step 1 loss 2.0\nstep 2 loss 1.5\n"
    assert pod in seen[0]
    result = cli("logs", name, "--follow")
    assert result.exit_code == 0
    assert "follow=true" in seen[-1]
    result = cli("logs", name, "--node", "3")
    assert result.exit_code == EXIT_REFUSED
    assert "no pod of" in result.stderr


# ------------------------------------------------------------------------------------------- messages


def test_forbidden_names_verb_and_resource(cli: Cli) -> None:
    cli.cluster.server.inject(method="GET", path="trainjobs", status=403, times=5)
    result = cli("status", "llama-s1")
    assert result.exit_code == EXIT_REFUSED
    err = " ".join(result.stderr.split())
    assert "cannot get trainjobs.trainer.kubeflow.org" in err
    assert "RBAC" in err
    assert len(result.stderr.strip().splitlines()) == 2  # one line of error, one of hint


def test_missing_trainer_crd(cli: Cli) -> None:
    cli.cluster.server.remove_kind("trainer.kubeflow.org", "trainjobs")
    for args in (("status", "x"), ("status",), ("open", "--job-id", "a", "--submission", "b")):
        result = cli(*args)
        assert result.exit_code == EXIT_REFUSED, args
        assert "install Kubeflow Trainer" in result.stderr, args


def test_unreachable_api_server_exits_3(cli: Cli) -> None:
    cli.cluster.server.inject(status="connect", times=100)
    result = cli("status", "x")
    assert result.exit_code == EXIT_RETRY
    err = " ".join(result.stderr.split())
    assert "cannot reach the API server" in err
    assert "is the cluster running?" in err
    assert "Traceback" not in result.output


def test_server_errors_exit_3(cli: Cli) -> None:
    cli.cluster.server.inject(status=503, times=100)
    result = cli("status", "x")
    assert result.exit_code == EXIT_RETRY
    assert "retry" in result.stderr


def test_debug_shows_the_traceback(cli: Cli) -> None:
    result = cli("--debug", "status", "nothere")
    assert result.exit_code == EXIT_REFUSED
    assert "Traceback" in result.stderr
    assert "NotFound" in result.stderr


def test_missing_kubeconfig_message(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dispatch.cli import app

    result = CliRunner().invoke(
        app, ["--kubeconfig", str(tmp_path / "nope"), "status", "x"], env={"COLUMNS": "250"}
    )
    assert result.exit_code == EXIT_REFUSED
    assert "does not exist" in result.stderr
    assert "dispatch testbed up" in result.stderr
    assert "Traceback" not in result.output


def test_unknown_context_message(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dispatch.cli import app

    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "a",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u"}}],
    }))
    result = CliRunner().invoke(app, ["--kubeconfig", str(kubeconfig), "--context", "nope", "status", "x"])
    assert result.exit_code == EXIT_REFUSED
    assert "nope" in result.stderr
    assert "--context" in result.stderr


# -------------------------------------------------------------------------------------- global options


def test_global_options_reach_the_adapter_factory(cli: Cli) -> None:
    cli("--kubeconfig", "/k", "--context", "c", "-n", "team-a", "--read-only", "status")
    s = cli.connected[-1]
    assert (s.kubeconfig, s.context, s.namespace, s.read_only) == ("/k", "c", "team-a", True)


def test_namespace_from_the_environment_and_per_command(cli: Cli) -> None:
    from typer.testing import CliRunner

    from dispatch import Adapter
    from dispatch.cli import CliState, Settings, app

    seen: list[Settings] = []

    def connect(settings: Settings) -> Adapter:
        seen.append(settings)
        return Adapter.connect(settings.namespace, transport=cli.cluster.transport())

    runner = CliRunner()
    runner.invoke(app, ["status"], obj=CliState(connect=connect), env={"DISPATCH_NAMESPACE": "from-env"})
    assert seen[-1].namespace == "from-env"
    runner.invoke(app, ["status", "-n", "flag"], obj=CliState(connect=connect), env={"DISPATCH_NAMESPACE": "x"})
    assert seen[-1].namespace == "flag"


def test_help_and_usage_errors_never_connect(cli: Cli) -> None:
    cli("status", "--help")
    cli("open")
    assert cli.connected == []


# ------------------------------------------------------------------------------------------ controller


def test_controller_is_called_with_the_global_options(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from dispatch.cli import _controller

    calls: list[ControllerOptions] = []

    def run_from_cli(options: ControllerOptions) -> int:
        calls.append(options)
        return 0

    monkeypatch.setattr(_controller, "run_from_cli", run_from_cli)
    result = cli("--kubeconfig", "/k", "--context", "c", "-n", "ns", "controller", "--metrics-port", "9090",
                 "--no-leader-elect", "--workers", "8", "--batch", "16", "--foreign", "ignore", "--log-level", "debug",
                 "--metrics-bind-address", ":8443", "--metrics-secure", "--metrics-cert-dir", "/certs")
    assert result.exit_code == 0, result.output
    assert calls == [ControllerOptions(
        kubeconfig="/k", context="c", namespace="ns", metrics_port=9090, leader_elect=False,
        lease_namespace="dispatch-system", lease_name="dispatch-admission-controller", identity=None,
        workers=8, batch=16, resync_seconds=60.0, foreign="ignore", log_level="debug",
        controller_name=CONTROLLER_NAME, metrics_bind_address=":8443",
        metrics_secure=True, metrics_cert_dir="/certs",
        guard_port=None, guard_cert_dir="",
        guard_webhook="dispatch-guard", kueue_namespace="kueue-system",
    )]
    cli("controller", "--kueue-namespace", "kueue-alt")
    assert calls[-1].kueue_namespace == "kueue-alt"
    cli("controller", "--guard-port", "9443", "--guard-cert-dir", "certs", "--guard-webhook", "")
    assert (calls[-1].guard_port, calls[-1].guard_cert_dir, calls[-1].guard_webhook) == (9443, "certs", "")
    cli("controller", "-n", "other")
    assert calls[-1].namespace == "other"
    assert calls[-1].leader_elect is True


def test_controller_exit_code_is_passed_on(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from dispatch.cli import _controller

    monkeypatch.setattr(_controller, "run_from_cli", lambda options: 1)
    assert cli("controller").exit_code == 1


def test_controller_errors_are_reported(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from dispatch import Forbidden
    from dispatch.cli import _controller

    def run_from_cli(options: ControllerOptions) -> None:
        raise Forbidden("forbidden: cannot watch workloads.kueue.x-k8s.io", reason="Forbidden", code=403)

    monkeypatch.setattr(_controller, "run_from_cli", run_from_cli)
    result = cli("controller")
    assert result.exit_code == EXIT_REFUSED
    assert "cannot watch workloads" in result.stderr


@pytest.mark.parametrize(("args", "named"), [
    (["--workers", "0"], "--workers"), (["--resync-seconds", "nan"], "--resync-seconds"),
    (["--foreign", "pass"], "--foreign"), (["--log-level", "loud"], "--log-level"),
    (["--guard-port", "70000"], "--guard-port"), (["--metrics-port", "-1"], "--metrics-port"),
])
def test_a_controller_option_out_of_its_bounds_is_a_usage_error_in_both_entry_points(
        cli: Cli, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str],
        named: str) -> None:
    from dispatch.cli import _controller
    from dispatch.controller.__main__ import main

    started: list[ControllerOptions] = []
    monkeypatch.setattr(_controller, "run_from_cli", started.append)
    result = cli("controller", *args)
    assert result.exit_code == EXIT_USAGE and named in result.stderr, result.stderr
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2 and named in capsys.readouterr().err
    assert started == []


def test_both_entry_points_take_exactly_the_controller_options(cli: Cli) -> None:
    """``dispatch controller`` and ``python -m dispatch.controller`` are both built from ControllerOptions:
    the same flags (the CLI's global --kubeconfig and --context aside), the same defaults."""
    import dataclasses

    import typer.main

    from dispatch._controller_options import options, parser
    from dispatch.cli import _controller

    command = typer.main.get_command(_controller.commands)
    cli_flags = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} - {"--help", "-h"}
    module_flags = {o for a in parser(environ=[])._actions for o in a.option_strings} - {"--help", "-h"}
    declared = {o.flag for o in options()}
    assert module_flags == declared | {"-n", "--no-leader-elect"}
    assert cli_flags == module_flags - {"--kubeconfig", "--context"}
    assert {p.name: p.default for p in command.params if p.name} == {
        f.name: f.default for f in dataclasses.fields(ControllerOptions) if f.name not in ("kubeconfig", "context")}


def test_release_wait_live_view_on_a_terminal(cli: Cli, running: Callable[[], str]) -> None:
    import io

    from rich.console import Console

    from dispatch import Adapter
    from dispatch.cli import CliState
    from dispatch.cli._release import release_wait

    name = running()
    assert cli("hold", name).exit_code == 0
    cli.cluster.settle()
    pod = cli.cluster.pods(name)[0]["metadata"]["name"]
    screen = io.StringIO()
    state = CliState(err=Console(file=screen, force_terminal=True, width=200))
    ticks = iter(range(1000))
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        cli.cluster.advance(10)
        cli.cluster.settle()

    with Adapter.connect("default", transport=cli.cluster.transport()) as adapter:
        identity = release_wait(state, adapter, name, timeout=1000, interval=5, clock=lambda: float(next(ticks)),
                                sleep=sleep)
    assert identity.admission == 2
    assert slept and all(s == 5 for s in slept)
    text = screen.getvalue()
    for word in ("WAITING", "NODE STATE", pod, "Ready=True", "admitted as llama/s1#2"):
        assert word in text


def test_ctrl_c_during_a_release_call_lets_it_finish_first() -> None:
    import os
    import signal
    import time

    from dispatch import Identity
    from dispatch.cli._release import release_once

    class Slow:
        finished = False

        def release(self, name: str) -> Identity:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            self.finished = True
            return Identity("llama", "s1", 3)

    # a CI runner may start the suite with SIGINT ignored (a background job); act as a terminal would
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        adapter = Slow()
        with pytest.raises(KeyboardInterrupt):
            release_once(adapter, "llama-s1")  # type: ignore[arg-type]
        assert adapter.finished
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_admin_release_pod_refusals_say_what_proof_is_missing(cli: Cli, running: Callable[[], str]) -> None:
    """dispatch refuses these itself (the cluster was never asked), so the hint names the missing proof."""
    name = running()
    obj = cli.cluster.pods(name)[0]
    pod, node = obj["metadata"]["name"], obj["spec"]["nodeName"]
    ready = cli("admin", "release-pod", pod, "--node-confirmed-down")
    assert ready.exit_code == EXIT_REFUSED
    assert "is Ready=True: its kubelet is answering" in ready.output and "restart it" in ready.output
    cli.cluster.freeze_node(node)
    cli.cluster.force_delete(pod)
    unproven = cli("admin", "release-pod", pod)
    assert unproven.exit_code == EXIT_REFUSED
    assert "end is unproven" in unproven.output and "confirm outside Kubernetes" in unproven.output
    assert "the cluster refused" not in unproven.output
    released = cli("admin", "release-pod", pod, "--node-confirmed-down")
    assert released.exit_code == 0 and f"released pod {pod} (end: operator-confirmed)" in released.output
    assert cli.cluster.server.get("", "pods", "default", pod) is None
    cli.cluster.taint_out_of_service(node)  # the operator's word, for the fake's process too
    cli.cluster.server.create("", "pods", "default", {"metadata": {"name": "foreign"}, "spec": {}})
    foreign = cli("admin", "release-pod", "foreign")
    assert foreign.exit_code == EXIT_REFUSED and "others belong to whoever set them" in foreign.output
