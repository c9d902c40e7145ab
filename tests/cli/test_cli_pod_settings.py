"""``dispatch open``'s pod settings (volumes, tolerations, service account, image pull secrets) from flags
and spec files: what is written reaches the TrainJob; what is wrong is refused by name (and by file and
line), with nothing written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatch.cli import EXIT_REFUSED, EXIT_USAGE

from .cli_harness import Cli


def pod_spec(cli: Cli, name: str = "llama-s1") -> dict[str, Any]:
    tj = cli.cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", name)
    assert isinstance(tj, dict)
    entry = tj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    result: dict[str, Any] = entry["template"]["spec"]["template"]["spec"]
    return result


def one_line(text: str) -> str:
    return " ".join(text.split())


EXPECTED = {
    "serviceAccountName": "trainer",
    "imagePullSecrets": [{"name": "regcred"}, {"name": "mirror"}],
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                    {"key": "pool", "operator": "Equal", "value": "a100", "effect": "NoExecute",
                     "tolerationSeconds": 300},
                    {"operator": "Exists"}],
    "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "llama-ckpt"}},
                {"name": "cfg", "configMap": {"name": "train-cfg"}},
                {"name": "scratch", "emptyDir": {}}],
    "containers": [{"name": "node", "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"},
                                                     {"name": "cfg", "mountPath": "/etc/train", "readOnly": True,
                                                      "subPath": "train.yaml"},
                                                     {"name": "scratch", "mountPath": "/scratch"}]}],
}


def test_flags_carry_every_pod_setting(cli: Cli) -> None:
    result = cli("open", "--job-id", "llama", "--submission", "s1",
                 "--volume", "name=ckpt,claim=llama-ckpt,mountPath=/ckpt",
                 "--volume", "name=cfg,configMap=train-cfg,mountPath=/etc/train,readOnly,subPath=train.yaml",
                 "--volume", "name=scratch,emptyDir,mountPath=/scratch",
                 "--toleration", "nvidia.com/gpu:NoSchedule", "--toleration", "pool=a100:NoExecute:300",
                 "--toleration", "*",
                 "--service-account", "trainer", "--image-pull-secret", "regcred,mirror")
    assert result.exit_code == 0, result.output
    assert pod_spec(cli) == EXPECTED


SPEC = """\
jobId: llama
submission: s1
volumes:
  - name: ckpt
    claim: llama-ckpt
    mountPath: /ckpt
  - {name: cfg, configMap: train-cfg, mountPath: /etc/train, readOnly: true, subPath: train.yaml}
  - {name: scratch, emptyDir: true, mountPath: /scratch}
tolerations:
  - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
  - {key: pool, value: a100, effect: NoExecute, tolerationSeconds: 300}
  - {operator: Exists}
serviceAccount: trainer
imagePullSecrets: [regcred, mirror]
"""


def test_a_spec_file_carries_every_pod_setting(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    result = cli("open", "-f", str(path))
    assert result.exit_code == 0, result.output
    assert pod_spec(cli) == EXPECTED


def test_flags_add_to_the_spec_files_lists(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("jobId: llama\nsubmission: s1\nvolumes: [{name: ckpt, claim: c, mountPath: /ckpt}]\n")
    result = cli("open", "-f", str(path), "--volume", "name=data,secret=s,mountPath=/data")
    assert result.exit_code == 0, result.output
    assert [v["name"] for v in pod_spec(cli)["volumes"]] == ["ckpt", "data"]


@pytest.mark.parametrize(("body", "words"), [
    ("volumes: [{name: ckpt, claim: c}]\n", "line 3: volumes[0] needs mountPath"),
    ("volumes: [{name: ckpt, claim: c, mountPath: /c, size: 1Gi}]\n", "unknown key 'size'"),
    ("volumes: [{name: ckpt, emptyDir: yes, mountPath: /c}]\n", "emptyDir must be true or false, got 'yes'"),
    ("volumes: {name: ckpt}\n", "volumes must be a list of mappings"),
    ("tolerations: [{key: gpu, tolerationSeconds: 3.5}]\n", "tolerationSeconds must be an integer"),
    ("imagePullSecrets: regcred\n", "imagePullSecrets must be a list of Secret names"),
    ("volumes: [{name: ckpt, claim: !!binary aGk=, mountPath: /c}]\n", "has the YAML tag !!binary"),
])
def test_spec_file_pod_settings_that_cannot_be_read_are_usage_errors(
    cli: Cli, tmp_path: Path, body: str, words: str
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("jobId: llama\nsubmission: s1\n" + body)
    result = cli("open", "-f", str(path))
    assert result.exit_code == EXIT_USAGE, result.output
    assert words in one_line(result.stderr)
    assert cli.cluster.server.requests == []


def test_a_bad_pod_setting_in_a_spec_file_is_refused_by_file_and_line(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("jobId: llama\nsubmission: s1\nvolumes:\n  - name: ckpt\n    claim: c\n    mountPath: ckpt\n"
                    "tolerations:\n  - {key: gpu, effect: NoRun}\nserviceAccount: Bad_SA\n")
    result = cli("open", "-f", str(path), "--volume", "name=Data,secret=s,mountPath=/data")
    assert result.exit_code == EXIT_REFUSED, result.output
    err = one_line(result.stderr)
    assert f"{path} line 6: volumes[0].mount_path: 'ckpt' must be an absolute path" in err
    assert f"{path} line 8: tolerations[0].effect: must be empty, NoSchedule" in err
    assert f"{path} line 9: service_account: 'Bad_SA' is not a valid ServiceAccount name" in err
    assert "; volumes[1].name: 'Data' is not a valid volume name" in err  # from --volume: no line
    assert cli.cluster.server.requests == []


@pytest.mark.parametrize(("args", "words"), [
    (("--volume", "name=ckpt,claim=c"), "needs mountPath"),
    (("--volume", "name=ckpt,pvc=c,mountPath=/c"), "unknown key 'pvc'"),
    (("--volume", "name=ckpt,claim,mountPath=/c"), "claim needs a value"),
    (("--volume", "name=a,name=b,mountPath=/c"), "name is given twice"),
    (("--volume", "name=a,emptyDir=yes,mountPath=/c"), "emptyDir must be true or false"),
    (("--toleration", "=x:NoSchedule"), "needs a key"),
    (("--toleration", "gpu:NoRun"), "the effect must be one of NoSchedule"),
    (("--toleration", "gpu:NoExecute:1.5"), "SECONDS must be an integer"),
])
def test_pod_setting_flags_that_cannot_be_read_are_usage_errors(cli: Cli, args: tuple[str, ...], words: str) -> None:
    result = cli("open", "--job-id", "llama", "--submission", "s1", *args)
    assert result.exit_code == EXIT_USAGE, result.output
    assert words in one_line(result.stderr)
    assert cli.cluster.server.requests == []


@pytest.mark.parametrize(("args", "words"), [
    (("--volume", "name=ckpt,claim=c,mountPath=/c,subPath=../up"), "volumes[0].sub_path: '../up' must not contain"),
    (("--volume", "name=ckpt,mountPath=/c"), "volumes[0]: must have exactly one source"),
    (("--toleration", "gpu=a b:NoSchedule"), "tolerations[0].value: 'a b' is not a valid label value"),
    (("--toleration", "gpu:NoSchedule:30"), "tolerations[0].seconds: is taken only with the effect NoExecute"),
    (("--service-account", "x" * 254), "service_account"),
    (("--image-pull-secret", "a,a"), "image_pull_secrets[1]: 'a' is given twice"),
])
def test_pod_setting_flags_the_api_would_refuse_are_refused_by_name(
    cli: Cli, args: tuple[str, ...], words: str
) -> None:
    result = cli("open", "--job-id", "llama", "--submission", "s1", *args)
    assert result.exit_code == EXIT_REFUSED, result.output
    assert words in one_line(result.stderr)
    assert cli.cluster.server.requests == []
