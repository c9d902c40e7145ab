"""Bad input on the command line: spec files reach the TrainJob exactly as written or are refused naming the
field; KEY=VALUE flags follow kubectl's comma rules; intervals are bounded; a server that is not the API
answers with a message. Nothing is written on a refusal."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest

from dispatch.cli import EXIT_REFUSED, EXIT_RETRY, EXIT_USAGE

from .cli_harness import Cli


def trainjob(cli: Cli, name: str = "llama-s1") -> dict[str, Any]:
    obj = cli.cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", name)
    assert isinstance(obj, dict)
    return obj


def writes(cli: Cli) -> list[tuple[str, str]]:
    return [(m, p) for m, p, _ in cli.cluster.server.requests if m in ("POST", "PUT", "PATCH", "DELETE")]


def template(tj: dict[str, Any]) -> dict[str, Any]:
    """The pod template of dispatch's runtime patch (pod annotations, node selector)."""
    entry = tj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    result: dict[str, Any] = entry["template"]["spec"]["template"]
    return result


def one_line(text: str) -> str:
    return " ".join(text.split())


HEAD = "jobId: llama\nsubmission: s1\n"

# ------------------------------------------------------------------------------------- spec files as written

# (spec file body after jobId/submission, where to look in the TrainJob, the value expected there)
AS_WRITTEN: list[tuple[str, Callable[[dict[str, Any]], Any], Any]] = [
    ("env: {A: true, B: 1.10, C: 010, D: on, E: no, F: 0x1F, G: 1e3, H: 2001-12-14, I: .inf, J: 1_000}\n",
     lambda tj: {e["name"]: e["value"] for e in tj["spec"]["trainer"]["env"] if "value" in e},
     {"A": "true", "B": "1.10", "C": "010", "D": "on", "E": "no", "F": "0x1F", "G": "1e3", "H": "2001-12-14",
      "I": ".inf", "J": "1_000"}),
    ("env:\n  on: 1\n  yes: 2\n  'true': 3\n",
     lambda tj: [e["name"] for e in tj["spec"]["trainer"]["env"] if "value" in e], ["on", "yes", "true"]),
    ("env: {Q: \"quoted \\\"x\\\"\", S: 'single', E: \"\", T: text   # a comment\n}\n",
     lambda tj: {e["name"]: e["value"] for e in tj["spec"]["trainer"]["env"] if "value" in e},
     {"Q": 'quoted "x"', "S": "single", "E": "", "T": "text"}),
    ("env:\n  SCRIPT: |\n    line one\n    line two\n",
     lambda tj: tj["spec"]["trainer"]["env"][0]["value"], "line one\nline two\n"),
    ("args: [--lr, 1e-4, --warmup, 010, --flag, true, --ratio, 1.10]\n",
     lambda tj: tj["spec"]["trainer"]["args"],
     ["--lr", "1e-4", "--warmup", "010", "--flag", "true", "--ratio", "1.10"]),
    ("command: python -c 'print(1)'\n", lambda tj: tj["spec"]["trainer"]["command"], ["python", "-c", "print(1)"]),
    ("resourcesPerNode: {cpu: 1.10, memory: 4Gi, ephemeral-storage: 1e9}\n",
     lambda tj: tj["spec"]["trainer"]["resourcesPerNode"]["requests"],
     {"cpu": "1.10", "memory": "4Gi", "ephemeral-storage": "1e9"}),
    ("labels: {tier: 010, flag: true}\n",
     lambda tj: {k: v for k, v in tj["metadata"]["labels"].items() if k in ("tier", "flag")},
     {"tier": "010", "flag": "true"}),
    ("nodeSelector: {gpu: true}\npodAnnotations: {example.com/n: 1.10}\n",
     lambda tj: (template(tj)["spec"]["nodeSelector"], template(tj)["metadata"]["annotations"]),
     ({"gpu": "true"}, {"example.com/n": "1.10"})),
    ("numNodes: 2\nterminationGracePeriodSeconds: 0\n", lambda tj: tj["spec"]["trainer"]["numNodes"], 2),
    ("image:\nqueue: ~\n", lambda tj: set(tj["spec"]["trainer"]), {"env"}),  # empty top-level values: not given
    ("env: &e {A: '1', B: x}\npodAnnotations:\n  <<: *e\n  B: y\n",  # a merge key; the mapping's own B wins
     lambda tj: template(tj)["metadata"]["annotations"], {"A": "1", "B": "y"}),
]


@pytest.mark.parametrize(("body", "look", "expected"), AS_WRITTEN, ids=[str(i) for i in range(len(AS_WRITTEN))])
def test_spec_file_values_reach_the_trainjob_exactly_as_written(
    cli: Cli, tmp_path: Path, body: str, look: Callable[[dict[str, Any]], Any], expected: Any
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(HEAD + body)
    result = cli("open", "-f", str(path))
    assert result.exit_code == 0, result.output
    assert look(trainjob(cli)) == expected


# (spec file body, words of the usage error)
REFUSED: list[tuple[str, str]] = [
    ("numNodes: 010\n", "numNodes must be an integer: 010 has a leading zero, which YAML 1.1 reads as octal (8)"),
    ("numNodes: '2'\n", "numNodes must be an integer, got '2' (quoted: write it without quotes)"),
    ("numNodes: 2.0\n", "numNodes must be an integer, got '2.0'"),
    ("numNodes: 0x2\n", "numNodes must be an integer"),
    ("numNodes: true\n", "numNodes must be an integer, got 'true'"),
    ("numNodes: [2]\n", "numNodes must be an integer"),
    ("terminationGracePeriodSeconds: 1e3\n", "terminationGracePeriodSeconds must be an integer"),
    ("env: {A: }\n", 'env.A has no value (empty); write A: "" for an empty string'),
    ("env: {A: ~}\n", "env.A has no value (~)"),
    ("env: {A: null}\n", "env.A has no value (null)"),
    ("env: {A: [1, 2]}\n", "env.A must be a single value, not a list"),
    ("env: {A: {b: c}}\n", "env.A must be a single value, not a mapping"),
    ("env: {A: '1', A: '2'}\n", "env: key 'A' is given twice"),
    ("env: [A=1]\n", "env must be a mapping of names to values"),
    ("env: {[a, b]: c}\n", "keys must be plain names"),
    ("labels: {team: }\n", "labels.team has no value"),
    ("image: [a]\n", "image must be a single value, not a list"),
    ("args: [--x, [nested]]\n", "args[1] must be a single value, not a list"),
    ("args: {a: b}\n", "args must be a list of strings or one string"),
    ("command: python 'unclosed\n", "cannot be split like a shell line"),
    ("jobId: other\n", "key 'jobId' is given twice"),
    ("on: yes\n", "unknown key(s)"),
    ("numNodes: 2\n---\nnumNodes: 3\n", "not valid YAML: expected a single document in the stream, but found another"),
    ("env: {A: *nowhere}\n", "not valid YAML: found undefined alias"),
]


@pytest.mark.parametrize(("body", "words"), REFUSED, ids=[w[:40] for _, w in REFUSED])
def test_spec_file_values_yaml_would_retype_are_refused_naming_the_field(
    cli: Cli, tmp_path: Path, body: str, words: str
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(HEAD + body)
    result = cli("open", "-f", str(path))
    assert result.exit_code == EXIT_USAGE, result.output
    assert words in one_line(result.stderr)
    assert "Traceback" not in result.output
    assert cli.connected == []  # refused before connecting: nothing was sent, nothing written


def test_a_spec_file_error_names_its_line(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(HEAD + "env:\n  A: '1'\n  B:\n")
    result = cli("open", "-f", str(path))
    assert f"{path} line 5: env.B has no value" in one_line(result.stderr)


def test_a_spec_file_that_is_not_utf8(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_bytes(b"jobId: \xff\n")
    result = cli("open", "-f", str(path))
    assert result.exit_code == EXIT_USAGE
    assert "is not UTF-8 text" in one_line(result.stderr)


def test_library_refusals_of_spec_file_values_exit_4_and_write_nothing(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(HEAD + "resourcesPerNode: {cpu: abc}\nenv: {MY VAR: x}\nlabels: {bad key: x}\n"
                    "terminationGracePeriodSeconds: -1\n")
    result = cli("open", "-f", str(path))
    assert result.exit_code == EXIT_REFUSED
    err = one_line(result.stderr)
    for field in ("resources_per_node[cpu]", "env[MY VAR]", "labels[bad key]",
                  "termination_grace_period_seconds: must not be negative (got -1)"):
        assert field in err
    assert cli.cluster.server.requests == []


# ---------------------------------------------------------------------------------------- KEY=VALUE flags


def test_env_and_pod_annotation_take_one_pair_per_flag_and_keep_commas(cli: Cli) -> None:
    result = cli("open", "--job-id", "llama", "--submission", "s1", "-e", "CUDA_VISIBLE_DEVICES=0,1",
                 "-e", "URLS=http://a,B=c", "-e", "EMPTY=", "-e", "SPACED= x ",
                 "--pod-annotation", "example.com/hosts=a,b", "--pod-annotation", "example.com/eq=x=y")
    assert result.exit_code == 0, result.output
    tj = trainjob(cli)
    assert [e for e in tj["spec"]["trainer"]["env"] if "value" in e] == [
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"}, {"name": "URLS", "value": "http://a,B=c"},
        {"name": "EMPTY", "value": ""}, {"name": "SPACED", "value": " x "},
    ]
    assert template(tj)["metadata"]["annotations"] == {"example.com/hosts": "a,b", "example.com/eq": "x=y"}


def test_labels_node_selectors_and_resources_may_be_comma_separated(cli: Cli) -> None:
    result = cli("open", "--job-id", "llama", "--submission", "s1", "-l", "team=ml,tier=gold", "-l", "x=y",
                 "--node-selector", "zone=a,gpu=a100", "-r", "cpu=2,memory=4Gi", "-r", "nvidia.com/gpu=1")
    assert result.exit_code == 0, result.output
    tj = trainjob(cli)
    assert {k: tj["metadata"]["labels"][k] for k in ("team", "tier", "x")} == {"team": "ml", "tier": "gold", "x": "y"}
    assert tj["spec"]["trainer"]["resourcesPerNode"]["requests"] == {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}
    assert template(tj)["spec"]["nodeSelector"] == {"zone": "a", "gpu": "a100"}


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("-e", "NOVALUE"), "--env expects KEY=VALUE; one per flag, got 'NOVALUE'"),
        (("-e", "=x"), "--env expects KEY=VALUE"),
        (("-e", "A=1", "-e", "A=2"), "--env gives A twice ('1' and '2')"),
        (("-l", "team=ml,"), "--label expects KEY=VALUE, comma-separated, got '' (in 'team=ml,')"),
        (("-l", "team=ml,tier"), "got 'tier' (in 'team=ml,tier')"),
        (("-l", "a=1,a=2"), "--label gives a twice"),
        (("--node-selector", "zone"), "--node-selector expects KEY=VALUE"),
        (("-r", "cpu"), "--resource expects KEY=VALUE"),
        (("--pod-annotation", "x"), "--pod-annotation expects KEY=VALUE; one per flag"),
        (("--command", "python 'unclosed"), "No closing quotation"),
    ],
)
def test_bad_pairs_are_usage_errors(cli: Cli, args: tuple[str, ...], words: str) -> None:
    result = cli("open", "--job-id", "llama", "--submission", "s1", *args)
    assert result.exit_code == EXIT_USAGE, result.output
    assert words in one_line(result.stderr)
    assert cli.connected == []


def test_a_label_with_a_space_after_its_comma_is_refused_not_trimmed(cli: Cli) -> None:
    result = cli("open", "--job-id", "llama", "--submission", "s1", "-l", "a=b, c=d")
    assert result.exit_code == EXIT_REFUSED
    assert "labels[ c]" in result.stderr
    assert cli.cluster.server.requests == []


def test_help_says_which_flags_split_at_commas(cli: Cli) -> None:
    text = one_line(cli("open", "--help").stdout)
    assert "one KEY=VALUE per flag (repeatable); the value is taken whole, commas and '=' included" in text
    assert "separated or repeated: -l team=ml,tier=gold" in text


# ------------------------------------------------------------------------------------ intervals and timeouts


@pytest.mark.parametrize(
    ("args", "option", "words"),
    [
        (("release", "x", "--wait", "--interval", "0"), "--interval", "must be 0.1 to 3600 seconds (got 0)"),
        (("release", "x", "--wait", "--interval", "-1"), "--interval", "got -1"),
        (("release", "x", "--wait", "--interval", "nan"), "--interval", "got nan"),
        (("release", "x", "--wait", "--interval", "inf"), "--interval", "got inf"),
        (("release", "x", "--wait", "--interval", "3601"), "--interval", "got 3601"),
        (("release", "x", "--wait", "--timeout", "-1"), "--timeout", "must be 0 to 604800 seconds"),
        (("release", "x", "--wait", "--timeout", "nan"), "--timeout", "got nan"),
        (("release", "x", "--wait", "--timeout", "1e9"), "--timeout", "got 1e+09"),
        (("wait", "x", "--for", "Running", "--interval", "0"), "--interval", "0.1 to 3600"),
        (("wait", "x", "--for", "Running", "--timeout", "inf"), "--timeout", "got inf"),
        (("demo", "--step-timeout", "0"), "--step-timeout", "must be 1 to 86400 seconds"),
        (("controller", "--resync-seconds", "0.5"), "--resync-seconds", "must be 1 to 86400 seconds"),
        (("controller", "--metrics-port", "70000"), "--metrics-port", "must be 0 to 65535 (got 70000)"),
        (("controller", "--log-level", "verbose"), "--log-level",
         "must be one of debug, info, warning, error (got 'verbose')"),
    ],
)
def test_intervals_and_timeouts_out_of_bounds_are_usage_errors(
    cli: Cli, args: tuple[str, ...], option: str, words: str
) -> None:
    result = cli(*args)
    assert result.exit_code == EXIT_USAGE, result.output
    err = one_line(result.stderr)
    assert option in err and words in err
    assert cli.connected == []


def test_the_smallest_interval_is_accepted(cli: Cli) -> None:
    assert cli("open", "--job-id", "llama", "--submission", "s1", "--queue", "lq").exit_code == 0
    result = cli("wait", "llama-s1", "--for", "Running", "--interval", "0.1", "--timeout", "0")
    assert result.exit_code == EXIT_RETRY  # one poll, then the timeout: Queued, not Running
    assert "timed out" in result.stderr


# ------------------------------------------------------------------------------- a server that is not the API


class HtmlServer:
    """Stands between the CLI and the fake cluster, answering chosen requests with an HTML page."""

    def __init__(self, cli: Cli, status: int, *, only: str = "", content_type: str = "text/html; charset=utf-8",
                 body: bytes = b"<html><head><title>Sign in - Example SSO</title></head><body>...</body></html>",
                 headers: dict[str, str] | None = None) -> None:
        self.cli, self.status, self.only = cli, status, only
        self.content_type, self.body, self.headers = content_type, body, headers or {}
        self.seen: list[tuple[str, str]] = []
        inner = cli.cluster.transport()

        async def handle(request: httpx2.Request) -> httpx2.Response:
            self.seen.append((request.method, request.url.path))
            if self.only in request.url.path:
                return httpx2.Response(self.status, content=self.body,
                                       headers={"Content-Type": self.content_type, **self.headers})
            return await inner.handle_async_request(request)

        cli.transport = lambda: httpx2.MockTransport(handle)


@pytest.mark.parametrize("status", [200, 302, 401, 403, 404])
def test_an_html_page_instead_of_the_api_is_refused_in_one_line(cli: Cli, status: int) -> None:
    server = HtmlServer(cli, status, headers={"Location": "https://sso.example/login"} if status == 302 else None)
    result = cli("open", "--job-id", "llama", "--submission", "s1")
    assert result.exit_code == EXIT_REFUSED, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2
    assert f"with HTTP {status} and a text/html body titled 'Sign in - Example SSO'" in lines[0]
    assert "not the Kubernetes API's JSON" in lines[0]
    if status == 302:
        assert "a redirect to https://sso.example/login" in lines[0]
    assert lines[1].startswith("hint: the kubeconfig's server URL does not reach a Kubernetes API server")
    assert "Traceback" not in result.output
    assert [m for m, _ in server.seen] == ["GET"]  # refused at the first read; nothing written
    assert writes(cli) == []


def test_an_html_502_from_a_proxy_is_retryable(cli: Cli) -> None:
    HtmlServer(cli, 502, body=b"<html><body><h1>502 Bad Gateway</h1></body></html>")
    result = cli("status", "x")
    assert result.exit_code == EXIT_RETRY
    err = one_line(result.stderr)
    assert "API server unavailable" in err and "HTTP 502 and a text/html body" in err
    assert "this may be temporary (exit code 3)" in err


def test_a_json_reply_that_is_not_json(cli: Cli) -> None:
    HtmlServer(cli, 200, content_type="application/json", body=b"{not json")
    result = cli("status", "x")
    assert result.exit_code == EXIT_REFUSED
    assert "HTTP 200 and a application/json body, not the Kubernetes API's JSON" in one_line(result.stderr)


def test_the_api_servers_own_plain_text_404_still_means_not_served(cli: Cli) -> None:
    """kube-apiserver answers a request for an API group it does not serve with a text/plain 404."""
    HtmlServer(cli, 404, only="trainer.kubeflow.org", content_type="text/plain; charset=utf-8",
               body=b"404 page not found\n")
    result = cli("open", "--job-id", "llama", "--submission", "s1")
    assert result.exit_code == EXIT_REFUSED
    assert "install Kubeflow Trainer" in result.stderr
    assert writes(cli) == []


# ------------------------------------------------------------------------- input refused, never reshaped


# (spec file body, words of the usage error): values a spec file cannot honour as written
REFUSED_AS_WRITTEN: list[tuple[str, str]] = [
    ("env: {A: !!binary aGVsbG8=}\n", "line 3: env.A has the YAML tag !!binary, which a spec does not take"),
    ("image: !!python/name:os.system x\n", "image has the YAML tag !!python/name:os.system"),
    ("queue: !local lq\n", "queue has the YAML tag !local,"),
    ("args: !!set {a, b}\n", "args has the YAML tag !!set"),
    ("labels: !!omap [{a: b}]\n", "labels has the YAML tag !!omap"),
    ("numNodes: !!float 2\n", "numNodes has the YAML tag !!float"),
    ("env: {!!binary aGk=: x}\n", "env has the YAML tag !!binary"),
    ("env: {A: ! x}\n", "env.A has the YAML tag !,"),
    ('env: {A: "a\\0b"}\n', "line 3: env.A contains the control character U+0000 at offset 1"),
    ('args: ["x\\x1b[31m"]\n', "args[0] contains the control character U+001B"),
    ('command: "python\\rtrain.py"\n', "command contains the control character U+000D"),
    ('labels: {a: "\\x7f"}\n', "labels.a contains the control character U+007F"),
    ("numNodes: 019\n", "has a leading zero, which YAML 1.1 reads as octal (not octal either)"),
    ("numNodes: 2_0\n", "numNodes must be an integer, got '2_0'"),
]


@pytest.mark.parametrize(("body", "words"), REFUSED_AS_WRITTEN, ids=[w[:40] for _, w in REFUSED_AS_WRITTEN])
def test_tags_and_control_characters_in_a_spec_file_are_refused_not_dropped(
    cli: Cli, tmp_path: Path, body: str, words: str
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(HEAD + body)
    result = cli("open", "-f", str(path))
    assert result.exit_code == EXIT_USAGE, result.output
    assert words in one_line(result.stderr)
    assert cli.connected == []


def test_explicit_str_and_int_tags_are_what_the_fields_are(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(HEAD + "env: !!map {A: !!str 1.10}\nargs: !!seq [!!str x]\nnumNodes: !!int 2\n"
                    'podAnnotations: {example.com/x: "a\\tb\\nc"}\n')
    result = cli("open", "-f", str(path))
    assert result.exit_code == 0, result.output
    tj = trainjob(cli)
    assert [e for e in tj["spec"]["trainer"]["env"] if "value" in e] == [{"name": "A", "value": "1.10"}]
    assert tj["spec"]["trainer"]["args"] == ["x"] and tj["spec"]["trainer"]["numNodes"] == 2
    assert template(tj)["metadata"]["annotations"] == {"example.com/x": "a\tb\nc"}  # tab and newline are text


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ("env: {DISPATCH_ADMISSION: '99'}\n", "env[DISPATCH_ADMISSION]",
         "is set by dispatch from the pod's label dispatch.phpboyscout.uk/admission"),
        ("env: {DISPATCH_JOB_ID: x}\n", "env[DISPATCH_JOB_ID]", "is set by dispatch from the pod's label"),
        ("env: {DISPATCH_ANYTHING: x}\n", "env[DISPATCH_ANYTHING]", "is reserved for dispatch"),
        ("numNodes: 2147483648\n", "num_nodes", "must be at most 2147483647, the largest int32 the API takes"),
        ("terminationGracePeriodSeconds: 9223372036854775808\n", "termination_grace_period_seconds",
         "must be at most 9223372036854775807, the largest int64"),
        ("resourcesPerNode: {memory: 9223372036854775808}\n", "resources_per_node[memory]",
         "the largest quantity the API keeps"),
        ("resourcesPerNode: {cpu: 0.1m}\n", "resources_per_node[cpu]", "finer than a thousandth"),
        ("resourcesPerNode: {cpu: 1e-4}\n", "resources_per_node[cpu]", "the API would round it up"),
    ],
)
def test_values_past_the_apis_ranges_and_reserved_names_are_refused_by_file_and_line(
    cli: Cli, tmp_path: Path, body: str, field: str, words: str
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(HEAD + body)
    result = cli("open", "-f", str(path))
    assert result.exit_code == EXIT_REFUSED, result.output
    err = one_line(result.stderr)
    assert f"{path} line 3: {field}: " in err and words in err
    assert cli.cluster.server.requests == []


def test_a_value_error_names_the_file_and_line_but_not_for_a_value_a_flag_gave(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(HEAD + "env:\n  OK: x\n  MY VAR: x\n  B: x\nimage: a b\nnumNodes: 0\n")
    result = cli("open", "-f", str(path), "-e", "B=\x02", "--nodes", "0")
    assert result.exit_code == EXIT_REFUSED
    err = one_line(result.stderr)
    assert f"{path} line 5: env[MY VAR]: 'MY VAR' is not an environment variable name" in err
    assert f"{path} line 7: image: 'a b' must not contain whitespace" in err
    assert "; env[B]: contains the control character U+0002" in err  # from --env: no file, no line
    assert "; num_nodes: must be at least 1" in err                  # --nodes overrode the file
    assert cli.cluster.server.requests == []


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--nodes", "2.0"), "--nodes must be an integer, got '2.0'"),
        (("--nodes", "010"), "--nodes must be an integer: 010 has a leading zero"),
        (("--nodes", "2_0"), "--nodes must be an integer, got '2_0'"),
        (("--nodes", " 2"), "--nodes must be an integer, got ' 2'"),
        (("--nodes", "+2"), "--nodes must be an integer, got '+2'"),
        (("--grace-period", "1e3"), "--grace-period must be an integer, got '1e3'"),
    ],
)
def test_integer_flags_follow_the_spec_files_rule(cli: Cli, args: tuple[str, ...], words: str) -> None:
    result = cli("open", "--job-id", "llama", "--submission", "s1", *args)
    assert result.exit_code == EXIT_USAGE, result.output
    assert words in one_line(result.stderr)
    assert cli.connected == []


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--nodes", "2147483648"), "num_nodes: must be at most 2147483647"),
        (("--nodes", "0"), "num_nodes: must be at least 1 (got 0)"),
        (("-e", "DISPATCH_ADMISSION=99"), "env[DISPATCH_ADMISSION]: is set by dispatch"),
        (("-e", "A=a\x1bb"), "env[A]: contains the control character U+001B"),
        (("--arg", "\x7f"), "args[0]: contains the control character U+007F"),
        (("--pod-annotation", "example.com/a=\x00"), "pod_annotations[example.com/a]: contains the control"),
    ],
)
def test_flag_values_past_the_apis_ranges_or_reserved_are_refused(cli: Cli, args: tuple[str, ...], words: str) -> None:
    result = cli("open", "--job-id", "llama", "--submission", "s1", *args)
    assert result.exit_code == EXIT_REFUSED, result.output
    assert words in one_line(result.stderr)
    assert cli.cluster.server.requests == []


def aliases(size: int) -> str:
    """A spec of about ``size`` bytes whose aliases expand a thousandfold (a 'billion laughs' of args)."""
    anchor = "x" * 1000
    refs = (size - 1100) // 4
    return f"{HEAD}env: {{A: &a {anchor}}}\nargs: [{', '.join(['*a'] * refs)}]\n"


def merges(depth: int) -> str:
    """Merge keys that repeat mappings exponentially: each level merges the one below it ten times."""
    def level(d: int) -> str:
        if d == 0:
            return "&m0 {" + ", ".join(f"K{i}: v" for i in range(10)) + "}"
        return f"&m{d} {{<<: [{level(d - 1)}, {', '.join([f'*m{d - 1}'] * 9)}]}}"
    return f"{HEAD}labels: {{<<: {level(depth)}}}\n"


@pytest.mark.parametrize("body", [aliases(1_000_000), merges(8)], ids=["aliases", "merges"])
def test_a_spec_whose_aliases_expand_past_the_request_limit_is_refused_in_bounded_memory(
    cli: Cli, tmp_path: Path, body: str
) -> None:
    """A ~1 MB file of aliases expanded to a ~250 MB request before; now refused once what it expands to
    passes the 1.5 MiB the API server can store as one object (memory measured, not time: time varies)."""
    path = tmp_path / "spec.yaml"
    path.write_text(body)
    tracemalloc.start()
    try:
        result = cli("open", "-f", str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.exit_code == EXIT_USAGE, result.output[:300]
    assert "the spec expands to more than 1572864 bytes (the most the API server can store as one object)" in (
        one_line(result.stderr))
    assert peak < 24 * 2**20, f"peak {peak / 2**20:.0f} MiB"  # measured: 7.1 MiB (aliases), 2.2 MiB (merges)
    assert cli.connected == []


def test_a_spec_file_larger_than_the_object_limit_is_not_read_whole(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(HEAD + "# " + "x" * (2 * 2**20) + "\n")
    result = cli("open", "-f", str(path))
    assert result.exit_code == EXIT_USAGE
    assert "is larger than 1572864 bytes, the most the API server can store as one object" in one_line(result.stderr)
