"""``dispatch open -f trainjob.yaml``: a whole TrainJob manifest is brought under dispatch as enrolment
would; YAML that would be reshaped on its way to JSON, spec flags given with a manifest, and what
enrolment refuses are refused, with nothing written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch import LABEL_JOB_ID, LABEL_SUBMISSION
from dispatch.cli import EXIT_REFUSED, EXIT_USAGE

from .cli_harness import Cli

MANIFEST = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: llama
  labels: {team: ml}
spec:
  runtimeRef: {name: torch-distributed}
  trainer:
    image: ghcr.io/example/train:1.0
    numNodes: 2
    env:
      - {name: EPOCHS, value: "3"}
"""


def one_line(text: str) -> str:
    return " ".join(text.split())


def trainjob(cli: Cli, name: str = "llama") -> dict[str, Any]:
    obj = cli.cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", name)
    assert isinstance(obj, dict)
    return obj


def writes(cli: Cli) -> list[tuple[str, str]]:
    return [(m, p) for m, p, _ in cli.cluster.server.requests if m in ("POST", "PUT", "PATCH", "DELETE")]


def test_a_manifest_is_opened_as_a_dispatch_object(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "trainjob.yaml"
    path.write_text(MANIFEST)
    result = cli("open", "-f", str(path))
    assert result.exit_code == 0, result.output
    obj = trainjob(cli)
    labels = obj["metadata"]["labels"]
    assert labels[LABEL_JOB_ID] == "llama" and labels["team"] == "ml" and labels[LABEL_SUBMISSION]
    assert f"opened llama in namespace default as llama/{labels[LABEL_SUBMISSION]}" in result.stdout
    assert obj["spec"]["trainer"]["numNodes"] == 2 and obj["spec"]["suspend"] is True
    assert obj["spec"]["trainer"]["env"][0] == {"name": "EPOCHS", "value": "3"}
    assert cli("release", "llama").exit_code == 0


def test_a_manifest_from_stdin_with_no_hold(cli: Cli) -> None:
    result = cli("-o", "json", "open", "-f", "-", "--no-hold", input=MANIFEST)
    assert result.exit_code == 0, result.output
    assert '"state": "Running"' in result.stdout


def test_dry_run_client_prints_the_enrolled_manifest(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "trainjob.yaml"
    path.write_text(MANIFEST)
    result = cli("-o", "yaml", "open", "-f", str(path), "--dry-run=client")
    assert result.exit_code == 0, result.output
    shown = yaml.safe_load(result.stdout)
    assert shown["metadata"]["labels"][LABEL_JOB_ID] == "llama" and shown["spec"]["suspend"] is True
    assert writes(cli) == []


@pytest.mark.parametrize("flag", [("--image", "x"), ("--job-id", "a"), ("--volume", "name=a,emptyDir,mountPath=/a"),
                                  ("-e", "A=1")])
def test_spec_flags_with_a_manifest_are_usage_errors(cli: Cli, tmp_path: Path, flag: tuple[str, str]) -> None:
    path = tmp_path / "trainjob.yaml"
    path.write_text(MANIFEST)
    result = cli("open", "-f", str(path), *flag)
    assert result.exit_code == EXIT_USAGE, result.output
    err = one_line(result.stderr)
    assert f"{path} is a TrainJob manifest:" in err and "edit it instead" in err
    assert cli.cluster.server.requests == []


@pytest.mark.parametrize(("change", "words"), [
    (("numNodes: 2", "numNodes: 010"), "line 10: spec.trainer.numNodes is '010', which YAML 1.1 reads as a number"),
    (("numNodes: 2", "numNodes: 0x2"), "spec.trainer.numNodes is '0x2'"),
    (("{team: ml}", "{team: ml, gpu: on}"), "metadata.labels.gpu is 'on', a boolean in YAML 1.1"),
    (("image: ghcr.io/example/train:1.0", "image: !!binary aGk="), "spec.trainer.image has the YAML tag !!binary"),
    (('value: "3"', "value: .inf"), "is '.inf', which is no JSON number"),
    (("name: llama", "name: llama\n  name: again"), "key 'name' is given twice"),
    (("name: llama", "name: \"lla\\x01ma\""), "contains the control character U+0001"),
    (("kind: TrainJob", "kind: TrainJob\n---\nkind: TrainJob"), "is not valid YAML"),
])
def test_yaml_that_would_be_reshaped_is_refused_by_line(
    cli: Cli, tmp_path: Path, change: tuple[str, str], words: str
) -> None:
    path = tmp_path / "trainjob.yaml"
    path.write_text(MANIFEST.replace(*change))
    result = cli("open", "-f", str(path))
    assert result.exit_code == EXIT_USAGE, result.output
    assert words in one_line(result.stderr)
    assert cli.cluster.server.requests == []


@pytest.mark.parametrize(("change", "words"), [
    (("kind: TrainJob", "kind: JobSet"), "kind: must be TrainJob (got 'JobSet')"),
    (("  name: llama\n", "  name: llama\n  namespace: prod\n"), "metadata.namespace: is 'prod', not the namespace"),
    (("{team: ml}", "{team: ml, dispatch.phpboyscout.uk/job-id: a b}"),
     "cannot be opened by dispatch: metadata.labels[dispatch.phpboyscout.uk/job-id] 'a b'"),
    (('- {name: EPOCHS, value: "3"}', '- {name: DISPATCH_ADMISSION, value: "99"}'),
     "spec.trainer.env[0] sets DISPATCH_ADMISSION"),
    (("{name: torch-distributed}", "{name: nope}"), "ClusterTrainingRuntime nope not found"),
])
def test_what_enrolment_refuses_is_refused_naming_the_field(
    cli: Cli, tmp_path: Path, change: tuple[str, str], words: str
) -> None:
    path = tmp_path / "trainjob.yaml"
    path.write_text(MANIFEST.replace(*change))
    result = cli("open", "-f", str(path))
    assert result.exit_code == EXIT_REFUSED, result.output
    assert words in one_line(result.stderr)
    assert writes(cli) == []


def test_a_spec_file_is_still_a_spec_file(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("jobId: llama\nsubmission: s1\n")
    assert cli("open", "-f", str(path)).exit_code == 0
    assert trainjob(cli, "llama-s1")["metadata"]["labels"][LABEL_SUBMISSION] == "s1"
