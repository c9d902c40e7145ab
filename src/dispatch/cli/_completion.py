"""Shell completion: ``dispatch completion bash|zsh|fish``, and kubectl's plugin completion.

Every shell asks the same question, as kubectl's shells do: ``dispatch __complete WORDS... INCOMPLETE`` prints
one candidate a line, then ``:DIRECTIVE`` (cobra's format, which kubectl reads from ``kubectl_complete-
dispatch`` too). The candidates are the commands (from ``_app.COMMANDS``, loading none), a command's options
(from its own parameters, so completion always knows every option the installed version has), option values
(formats, states, shells), and what kubectl completes from the cluster: object names (``status <TAB>``),
namespaces (``-n <TAB>``), and contexts, clusters and users from the kubeconfig. A cluster that does not answer
within ``CLUSTER_TIMEOUT`` completes nothing; a TAB never prints an error.
"""

from __future__ import annotations

import os
import sys
from typing import Any

COBRA_DEFAULT = 0
"""cobra's ShellCompDirectiveDefault: the shell may offer file names when there is no candidate."""
COBRA_NO_FILE_COMPLETION = 4
"""cobra's ShellCompDirectiveNoFileComp: offer no file names when there is no candidate."""
CLUSTER_TIMEOUT = 3.0
"""Seconds a completion waits for the API server (one attempt, no retries)."""
HIDDEN_COMMAND = "__complete"

OUTPUT_VALUES = ("table", "wide", "name", "json", "yaml", "jsonpath=", "custom-columns=")
FILE_OPTIONS = frozenset({"kubeconfig", "certificate_authority", "spec_file"})
"""Options whose value is a file: the shell completes file names."""
OBJECT_ARGUMENTS = frozenset({"NAME"})
"""Arguments that name a TrainJob: completed with the namespace's TrainJobs."""


def complete_var(prog: str) -> str:
    return "_{}_COMPLETE".format(prog.replace("-", "_").replace(" ", "_").upper())


BASH = """\
_dispatch_completion() {
    local IFS=$'\\n' cur=${COMP_WORDS[COMP_CWORD]} out directive
    out=$(%(prog)s __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null) || return 0
    directive=${out##*:}
    out=${out%%:*}
    COMPREPLY=( $(compgen -W "$out" -- "$cur") )
    if (( ${#COMPREPLY[@]} == 0 && (directive & 4) )); then
        compopt +o default 2>/dev/null
    fi
    return 0
}

complete -o default -F _dispatch_completion %(prog)s
"""
ZSH = """\
#compdef %(prog)s

_dispatch_completion() {
    local out directive
    local -a candidates
    out=$(%(prog)s __complete "${(@)words[2,$CURRENT]}" 2>/dev/null) || return 1
    directive=${out##*:}
    candidates=("${(@f)${out%%:*}}")
    candidates=(${candidates:#})
    if (( ${#candidates} )); then
        compadd -- "${candidates[@]}"
    elif (( ! (directive & 4) )); then
        _files
    fi
}

compdef _dispatch_completion %(prog)s
"""
FISH = """\
function __dispatch_completion
    set -l words (commandline -opc) (commandline -ct)
    set -e words[1]
    %(prog)s __complete $words 2>/dev/null | string match -v -r '^:[0-9]+$'
end

complete --command %(prog)s --no-files --arguments '(__dispatch_completion)'
"""
SCRIPTS = {"bash": BASH, "zsh": ZSH, "fish": FISH}


def completion_script(prog: str, shell: str) -> str:
    """The script ``shell`` sources to complete ``prog``."""
    return SCRIPTS[shell] % {"prog": prog}


def answer_shell(args: list[str], *, prog: str) -> bool:
    """Answer a shell's TAB if this run is one (``__complete ...``, or the bash script of an older version,
    which sets ``_DISPATCH_COMPLETE``); False for any other run."""
    if args[:1] == [HIDDEN_COMMAND]:
        complete_main(args[1:])
        return True
    if os.environ.get(complete_var(prog)) == "complete_bash":  # scripts printed by dispatch 0.1.0
        words = os.environ.get("COMP_WORDS", "").split()
        cword = int(os.environ.get("COMP_CWORD", "0") or 0)
        typed = [*words[1:cword], words[cword] if cword < len(words) else ""]
        for value in candidates(typed)[0]:
            sys.stdout.write(value + "\n")
        return True
    return False


def complete_main(args: list[str]) -> None:
    """cobra's ``__complete``: candidates, one a line, then ``:directive``."""
    found, directive = candidates(args)
    sys.stdout.write("".join(value + "\n" for value in found) + f":{directive}\n")


def candidates(args: list[str]) -> tuple[list[str], int]:
    """What completes the last of ``args`` (the words after the program's name; the last may be empty), and
    cobra's directive."""
    try:
        return _candidates(args)
    except Exception:  # a TAB never prints a traceback: it completes nothing
        return [], COBRA_NO_FILE_COMPLETION


def _candidates(args: list[str]) -> tuple[list[str], int]:
    from ._registry import ALIASES, COMMANDS, hoist

    words, incomplete = (hoist(args[:-1]), args[-1]) if args else ([], "")
    if not words and not incomplete.startswith("-"):
        return _prefixed(list(COMMANDS), incomplete), COBRA_NO_FILE_COMPLETION  # nothing built, nothing loaded
    if len(words) == 1 and not incomplete.startswith("-"):
        entry = COMMANDS.get(ALIASES.get(words[0], words[0]))
        if entry is not None and entry.names_object:  # its NAME, as below, without building the parser
            return _prefixed(_from_cluster("trainjobs", {}), incomplete), COBRA_NO_FILE_COMPLETION
    import typer.main

    from ._app import app

    root: Any = typer.main.get_command(app)
    command: Any = root
    given: dict[str, Any] = {}
    expecting: Any = None
    positional = 0
    for word in words:
        if expecting is not None:
            given[expecting.name] = word
            expecting = None
            continue
        if word.startswith("-") and word != "-":
            name, eq, value = word.partition("=")
            param = _option(command, name) or _option(root, name)
            if param is not None and not param.is_flag and not param.count:
                if eq:
                    given[param.name] = value
                else:
                    expecting = param
            continue
        if _is_group(command):
            sub = ALIASES.get(word, word) if command is root else word
            found = command.commands.get(sub) if command is not root else (
                command.commands[sub] if sub in COMMANDS else None)
            if found is None:
                return [], COBRA_NO_FILE_COMPLETION
            command = found
            continue
        positional += 1
    if expecting is not None:
        return _values(expecting, command, incomplete, given)
    if incomplete.startswith("-"):
        name, eq, value = incomplete.partition("=")
        if eq:
            param = _option(command, name) or _option(root, name)
            found_values, directive = _values(param, command, value, given) if param is not None else ([], 4)
            return [f"{name}={v}" for v in found_values], directive
        options = [o for p in _options(command) for o in p.opts if o.startswith("--")]
        if command is not root:
            options += [o for p in _options(root) for o in p.opts if o.startswith("--") and o not in options]
        return _prefixed(options, incomplete), COBRA_NO_FILE_COMPLETION
    if _is_group(command):
        names = list(COMMANDS) if command is root else [n for n in command.list_commands(None)
                                                         if not command.commands[n].hidden]
        return _prefixed(names, incomplete), COBRA_NO_FILE_COMPLETION
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    if positional < len(arguments):
        return _argument(arguments[positional], command, incomplete, given)
    return [], COBRA_NO_FILE_COMPLETION


def _prefixed(values: list[str], incomplete: str) -> list[str]:
    return [v for v in values if v.startswith(incomplete)]


def _is_group(command: Any) -> bool:
    return hasattr(command, "commands")


def _options(command: Any) -> list[Any]:
    return [p for p in command.params if p.param_type_name == "option" and not getattr(p, "hidden", False)]


def _option(command: Any, name: str) -> Any:
    for p in _options(command):
        if name in p.opts or name in p.secondary_opts:
            return p
    return None


def _values(param: Any, command: Any, incomplete: str, given: dict[str, Any]) -> tuple[list[str], int]:
    """Values of the option ``param``."""
    name = param.name
    if name in FILE_OPTIONS:
        return [], COBRA_DEFAULT
    if name == "output":
        return _prefixed(list(OUTPUT_VALUES), incomplete), COBRA_NO_FILE_COMPLETION
    if name in ("context", "cluster", "user"):
        from .._kubeconfig import entry_names

        return _prefixed(entry_names(given.get("kubeconfig"))[f"{name}s"], incomplete), COBRA_NO_FILE_COMPLETION
    if name == "namespace":
        return _prefixed(_from_cluster("namespaces", given), incomplete), COBRA_NO_FILE_COMPLETION
    return _own(param, command, incomplete), COBRA_NO_FILE_COMPLETION


def _own(param: Any, command: Any, incomplete: str) -> list[str]:
    """What the parameter completes by itself (a choice's values, such as ``--state``'s)."""
    import typer

    return [str(item.value) for item in param.shell_complete(typer.Context(command), incomplete)]


def _argument(param: Any, command: Any, incomplete: str, given: dict[str, Any]) -> tuple[list[str], int]:
    if param.metavar in OBJECT_ARGUMENTS:
        return _prefixed(_from_cluster("trainjobs", given), incomplete), COBRA_NO_FILE_COMPLETION
    if param.metavar == "SHELL":
        return _prefixed(sorted(SCRIPTS), incomplete), COBRA_NO_FILE_COMPLETION
    return _own(param, command, incomplete), COBRA_NO_FILE_COMPLETION


def _from_cluster(what: str, given: dict[str, Any]) -> list[str]:
    """The names of the namespace's TrainJobs, or of the namespaces, as the command line typed so far would
    connect (its kubeconfig, context, namespace and kubectl flags); nothing if the cluster does not answer."""
    import asyncio

    from .. import _kube as k
    from .._overrides import ConfigOverrides

    overrides = ConfigOverrides(
        cluster=given.get("cluster"), user=given.get("user"), server=given.get("server"), token=given.get("token"),
        certificate_authority=given.get("certificate_authority"), tls_server_name=given.get("tls_server_name"),
        impersonate=given.get("impersonate"), impersonate_uid=given.get("impersonate_uid"),
    )
    namespace = given.get("namespace") or os.environ.get("DISPATCH_NAMESPACE") or None

    async def names() -> list[str]:
        kube = k.Kube.connect(namespace=namespace, kubeconfig=given.get("kubeconfig"), context=given.get("context"),
                              timeout=CLUSTER_TIMEOUT, request_timeout=CLUSTER_TIMEOUT, overrides=overrides)
        kube.retries = 1
        try:
            res = k.TRAINJOBS if what == "trainjobs" else k.NAMESPACES
            listed = await kube.list(res, None if what == "namespaces" else kube.namespace)
            return sorted(str((item.get("metadata") or {}).get("name", "")) for item in listed.items)
        finally:
            await kube.aclose()

    return asyncio.run(asyncio.wait_for(names(), CLUSTER_TIMEOUT + 1))
