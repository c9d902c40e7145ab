"""kubectl's habits (issue 38): its client flags anywhere on the line, its verbs, and a runtime's warning said
where it matters."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dispatch import ConfigOverrides
from dispatch.cli import EXIT_USAGE

from .cli_harness import Cli

# ------------------------------------------------------------------------------------------- one warning, once

RISK = "podReplacementPolicy"


def test_the_runtime_warning_is_said_by_open_and_status_not_by_every_command(cli: Cli) -> None:
    """The fake's default runtime leaves podReplacementPolicy unset, as the runtimes Trainer ships do."""
    opened = cli("open", "--job-id", "llama", "--submission", "s1")
    assert opened.exit_code == 0 and RISK in opened.stderr, opened.output
    assert cli("release", "llama-s1").exit_code == 0
    cli.cluster.settle()
    status = cli("status", "llama-s1")
    assert status.exit_code == 0 and f"warning: {RISK}" in status.stderr
    for args in (("hold", "llama-s1"), ("wait", "llama-s1", "--for", "Held", "--timeout", "5"), ("status",),
                 ("ceased", "llama-s1")):
        result = cli(*args)
        assert RISK not in result.stderr, (args, result.stderr)
    assert RISK in cli.json("status", "llama-s1")["warnings"][0]  # still in the object's status for scripts


def test_a_runtime_that_replaces_only_failed_pods_draws_no_warning(cli: Cli) -> None:
    cli.cluster.add_runtime("safe", replacement_policy="Failed")
    opened = cli("open", "--job-id", "llama", "--submission", "s1", "--runtime", "safe")
    assert opened.exit_code == 0 and RISK not in opened.stderr


# ---------------------------------------------------------------------------------------------- kubectl's verbs


@pytest.mark.parametrize(("verb", "named"), [("delete", "dispatch close NAME"), ("describe", "dispatch status NAME")])
def test_a_kubectl_verb_is_a_usage_error_naming_dispatchs_verb(cli: Cli, verb: str, named: str,
                                                               running: Callable[[], str]) -> None:
    name = running()
    connections = len(cli.connected)
    result = cli(verb, name)
    assert result.exit_code == EXIT_USAGE and named in result.stderr, result.stderr
    assert "release" not in result.stderr and "open" not in result.stderr
    assert len(cli.connected) == connections  # a usage error never connects: nothing was deleted
    assert cli.cluster.server.objects("trainer.kubeflow.org", "trainjobs", "default")


def test_get_is_status(cli: Cli, running: Callable[[], str]) -> None:
    name = running()
    assert cli.json("get", name) == cli.json("status", name)


@pytest.mark.parametrize("typo", ["relese", "opne", "delet", "creat", "releas", "controler", "dem", "testbd"])
def test_a_mistyped_verb_is_never_answered_with_a_verb_that_starts_something(cli: Cli, typo: str) -> None:
    result = cli(typo, "x")
    assert result.exit_code == EXIT_USAGE
    for starts in ("'open'", "'release'", "'controller'", "'demo'", "'testbed'"):
        assert starts not in result.stderr, result.stderr


def test_a_mistyped_harmless_verb_is_suggested(cli: Cli) -> None:
    result = cli("statsu", "x")
    assert result.exit_code == EXIT_USAGE and "Did you mean 'status'?" in result.stderr


# ------------------------------------------------------------------------------------ kubectl's flags anywhere


def test_kubectls_client_flags_after_the_command(cli: Cli) -> None:
    result = cli("status", "x", "--context", "c", "--kubeconfig", "/k", "--request-timeout", "5s", "--as", "alice",
                 "--as-group", "ml", "--as-group=ops", "--token", "t", "--server", "https://h:6443", "--cluster", "k",
                 "--user", "u", "--certificate-authority", "/ca.pem", "--tls-server-name", "api.h",
                 "--insecure-skip-tls-verify=false", "-v=6", "--read-only")
    assert result.exit_code != EXIT_USAGE, result.stderr
    s = cli.connected[-1]
    assert (s.context, s.kubeconfig, s.request_timeout, s.read_only, s.verbosity) == ("c", "/k", 5.0, True, 6)
    assert s.overrides == ConfigOverrides(
        cluster="k", user="u", server="https://h:6443", token="t", certificate_authority="/ca.pem",
        insecure_skip_tls_verify=False, tls_server_name="api.h", impersonate="alice", impersonate_groups=("ml", "ops"))


def test_flags_before_and_after_mean_the_same(cli: Cli) -> None:
    cli("--context", "c", "-n", "team-a", "status", "--as", "bob", "-v", "7")
    before = cli.connected[-1]
    cli("status", "-n", "team-a", "--as", "bob", "--context", "c", "-v7")
    after = cli.connected[-1]
    assert (before.context, before.namespace, before.overrides, before.verbosity) == (
        after.context, after.namespace, after.overrides, after.verbosity) == ("c", "team-a",
                                                                             ConfigOverrides(impersonate="bob"), 7)
    cli("admin", "workers", "--insecure-skip-tls-verify")
    assert cli.connected[-1].overrides == ConfigOverrides(insecure_skip_tls_verify=True)


def test_no_command_takes_a_global_flag_of_its_own() -> None:
    """A global flag is moved before the command wherever it is written: no command may define one itself."""
    import typer.main

    from dispatch.cli._app import load
    from dispatch.cli._registry import COMMANDS, GLOBAL_FLAGS, GLOBAL_VALUES

    def flags(command: object) -> set[str]:
        found = {o for p in getattr(command, "params", []) for o in (*p.opts, *p.secondary_opts)}
        for sub in getattr(command, "commands", {}).values():
            found |= flags(sub)
        return found

    for name in COMMANDS:
        assert not flags(load(name)) & (GLOBAL_FLAGS | GLOBAL_VALUES), name
    from dispatch.cli import app

    root = typer.main.get_command(app)
    assert {o for p in root.params for o in p.opts} >= GLOBAL_FLAGS | GLOBAL_VALUES


def test_everything_after_a_double_dash_stays_put() -> None:
    from dispatch.cli._registry import hoist

    assert hoist(["open", "--arg", "x", "--", "--context", "y"]) == ["open", "--arg", "x", "--", "--context", "y"]
    assert hoist(["status", "--context=y", "-v=3"]) == ["--context", "y", "-v", "3", "status"]
