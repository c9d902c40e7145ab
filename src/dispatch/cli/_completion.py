"""Shell completion: ``dispatch completion bash|zsh|fish``, and kubectl's plugin completion.

The scripts are typer's own (they call ``dispatch`` back with ``_DISPATCH_COMPLETE`` set, and the command
line's parser answers), so completion always knows every command, option and choice the installed
version has. ``kubectl dispatch <TAB>`` asks the ``kubectl_complete-dispatch`` executable (kubectl 1.26+),
which answers in kubectl's own format: one candidate per line, then ``:<directive>``.
"""

from __future__ import annotations

import sys

import typer
from typer._completion_classes import completion_init as completion_init  # typer registers its shells here
from typer._completion_shared import get_completion_script

COBRA_NO_FILE_COMPLETION = 4
"""cobra's ShellCompDirectiveNoFileComp: offer no file names when there is no candidate."""


def complete_var(prog: str) -> str:
    return "_{}_COMPLETE".format(prog.replace("-", "_").replace(" ", "_").upper())


def completion_script(prog: str, shell: str) -> str:
    """The script ``shell`` sources to complete ``prog``."""
    completion_init()
    return get_completion_script(prog_name=prog, complete_var=complete_var(prog), shell=shell)


def kubectl_candidates(app: typer.Typer, args: list[str]) -> list[str]:
    """What completes the last of ``args`` (``kubectl dispatch ARGS``; the last may be empty)."""
    from typer._click.shell_completion import CompletionItem, ShellComplete  # typer vendors click

    class Cobra(ShellComplete):
        """Only ``get_completions`` is used: kubectl, not a shell script, asks."""

        def source_vars(self) -> dict[str, object]:
            return {}

        def get_completion_args(self) -> tuple[list[str], str]:
            return words, incomplete

        def format_completion(self, item: CompletionItem) -> str:
            return str(item.value)

    command = typer.main.get_command(app)
    words, incomplete = (args[:-1], args[-1]) if args else ([], "")
    completer = Cobra(command, {}, "kubectl dispatch", complete_var("kubectl-dispatch"))
    return [str(item.value) for item in completer.get_completions(words, incomplete)]


def kubectl_complete_main() -> None:
    """Entry point of ``kubectl_complete-dispatch``: kubectl runs it with the words typed after
    ``kubectl dispatch`` (the last one being completed) and reads cobra's format back."""
    from ._app import app

    for value in kubectl_candidates(app, sys.argv[1:]):
        sys.stdout.write(value + "\n")
    sys.stdout.write(f":{COBRA_NO_FILE_COMPLETION}\n")
