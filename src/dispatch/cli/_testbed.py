"""``dispatch testbed`` and ``dispatch demo``: the local real control plane (loaded only for these)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from ._codes import EXIT_CODES_HELP, EXIT_FAILURE, EXIT_USAGE
from ._common import OutputOpt, _state
from ._errors import guard
from ._output import Column, Grid, emit, show
from ._state import CliState
from ._timing import STEP_TIMEOUT

testbed_app = typer.Typer(
    help="The local real control plane (etcd, kube-apiserver, controllers, KWOK nodes) for trying dispatch.",
    no_args_is_help=True,
    rich_markup_mode=None,
    add_completion=False,
)
commands = typer.Typer(rich_markup_mode=None, add_completion=False)
"""``demo`` (``testbed_app`` is the ``testbed`` group)."""

def _testbed(state: CliState) -> Any:
    from .. import testbed

    return testbed


StackOpt = Annotated[
    str | None,
    typer.Option(
        "--stack",
        envvar="DISPATCH_TESTBED_STACK",
        show_envvar=True,
        metavar="NAME",
        help="Testbed stack of versions (see `dispatch testbed stacks`; default: testbed/stacks/default).",
    ),
]


def _select_stack(ctx: typer.Context, stack: str | None) -> None:
    """Select the stack for this command and the build/start processes it runs; refuse unknown names."""
    if stack is None:
        return
    from .. import testbed

    try:
        testbed.select_stack(stack)
    except ValueError as exc:
        _state(ctx).err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None


@testbed_app.callback()
def testbed_root(ctx: typer.Context, stack: StackOpt = None) -> None:
    _select_stack(ctx, stack)


NoRealNodeOpt = Annotated[
    bool,
    typer.Option(
        "--no-real-node",
        help="No real node (the stack's kubelet with containerd, beside the KWOK nodes): neither built nor "
        "started. Same as DISPATCH_TESTBED_REAL_NODE=0.",
    ),
]


def _no_real_node(off: bool) -> None:
    if off:
        os.environ["DISPATCH_TESTBED_REAL_NODE"] = "0"  # the build script and every child see it too


@testbed_app.command("stacks")
def testbed_stacks(ctx: typer.Context) -> None:
    """The stacks of versions the testbed can build (the selected one marked *)."""
    state = _state(ctx)
    tb = _testbed(state)
    with _testbed_errors(state):
        selected = tb.stack()
        for name in tb.stacks():
            pins = " ".join(f"{k.removesuffix('_VERSION').lower()}={v}" for k, v in tb.versions(name).items())
            state.out.print(f"{'*' if name == selected else ' '} {name:10} {pins}", highlight=False)


@contextlib.contextmanager
def _testbed_errors(state: CliState) -> Iterator[None]:
    """Any failure of a testbed command as an error line, a hint where one is known, and exit 1."""
    try:
        yield
    except Exception as exc:
        state.err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        if "root" in str(exc).lower() or isinstance(exc, PermissionError):
            state.err.print("[yellow]hint:[/] the testbed must run as root (Kueue's certificate path)",
                            highlight=False)
        elif shutil.which("go") is None:
            state.err.print("[yellow]hint:[/] the testbed is built from Go modules: install Go", highlight=False)
        raise typer.Exit(EXIT_FAILURE) from None


@testbed_app.command("build")
def testbed_build(ctx: typer.Context, no_real_node: NoRealNodeOpt = False) -> None:
    """Build the testbed's binaries (a no-op when already built)."""
    state = _state(ctx)
    _no_real_node(no_real_node)
    with _testbed_errors(state):
        path = _testbed(state).build()
    state.out.print(f"built: {path}")


@testbed_app.command("up")
def testbed_up(ctx: typer.Context, no_real_node: NoRealNodeOpt = False) -> None:
    """Build (if needed) and start the testbed; print its kubeconfig. Where the host allows (root, cgroups,
    containerd, runc and the CNI plugins installed), a real node runs beside the KWOK nodes."""
    state = _state(ctx)
    _no_real_node(no_real_node)
    with _testbed_errors(state):
        kubeconfig = _testbed(state).up()
    state.out.print(f"testbed up; kubeconfig: {kubeconfig}")
    state.out.print(f"use it with: export KUBECONFIG={kubeconfig}")


@testbed_app.command("down")
def testbed_down(ctx: typer.Context) -> None:
    """Stop the testbed and discard its data."""
    state = _state(ctx)
    with _testbed_errors(state):
        _testbed(state).down()
    state.out.print("testbed down")


@testbed_app.command("status")
def testbed_status(ctx: typer.Context, output: OutputOpt = None) -> None:
    """Each component: running, healthy or frozen."""
    state = _state(ctx, output, named=False)
    tb = _testbed(state)
    with _testbed_errors(state):
        components = tb.status()
        kubeconfig = str(tb.kubeconfig_path())
        real_node = tb.real_node() if _any_running(components) else None
        real_problem = None if real_node else tb.real_node_problem()
    up = all(c.healthy or c.frozen for c in components)

    def human() -> None:
        grid = Grid([Column("COMPONENT"), Column("PID"), Column("STATE")])
        for c in components:
            word = "frozen" if c.frozen else "healthy" if c.healthy else "running" if c.running else "stopped"
            style = {"healthy": "green", "frozen": "cyan", "running": "yellow", "stopped": "red"}[word]
            grid.add([c.name, "-" if c.pid is None else str(c.pid), Text(word, style=style)])
        show(state, grid)
        state.out.print(f"testbed is {'up' if up else 'not up'}; kubeconfig: {kubeconfig}")
        if real_node:
            state.out.print(f"real node: {real_node} (label dispatch.test/real-node=true, NoSchedule taint)")
        elif up:
            state.out.print(f"real node: none ({real_problem})", highlight=False)

    emit(
        state,
        {"up": up, "kubeconfig": kubeconfig, "components": [dataclasses.asdict(c) for c in components],
         "realNode": real_node, "realNodeProblem": real_problem},
        human,
    )


def _any_running(components: list[Any]) -> bool:
    """Any component running: only then is the real node worth asking about."""
    return any(c.running for c in components)


@testbed_app.command("freeze")
def testbed_freeze(
    ctx: typer.Context, node: Annotated[str, typer.Argument(metavar="NODE", help="A freezable node.")]
) -> None:
    """Stop a node's kubelet (its KWOK process, or the real node's kubelet): the node goes Ready=Unknown, its
    pods keep 'running' (on the real node, really)."""
    state = _state(ctx)
    with _testbed_errors(state):
        _testbed(state).freeze(node)
    state.out.print(f"froze {node}: it goes Ready=Unknown within the node monitor grace period")


@testbed_app.command("thaw")
def testbed_thaw(
    ctx: typer.Context, node: Annotated[str, typer.Argument(metavar="NODE", help="A frozen node.")]
) -> None:
    """Resume a frozen node's kubelet."""
    state = _state(ctx)
    with _testbed_errors(state):
        _testbed(state).thaw(node)
    state.out.print(f"thawed {node}")


# ----------------------------------------------------------------------------------------------- demo


@commands.command("demo",
                  epilog=EXIT_CODES_HELP + " The demo exits 1 if the promise was broken or a step failed.")
def demo(
    ctx: typer.Context,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the demo's namespace and objects afterwards.")] = False,
    step_timeout: Annotated[
        float, STEP_TIMEOUT.option("--step-timeout", "Seconds each step may take before the demo fails")
    ] = 120.0,
    stack: StackOpt = None,
    real_node: Annotated[bool, typer.Option(
        "--real-node", help="Run the story on the testbed's real node: a real kubelet, real processes, and "
                            "the processes' own record as the judge.")] = False,
) -> None:
    """Walk through the promise on the local testbed (built and started if needed).

    A TrainJob runs, is held, its pods stay Terminating and release is refused naming them; they go and
    release admits with A=2. Then a frozen node (Ready=Unknown): not ceased until the operator's
    out-of-service taint, then release admits. Fails if two executions of one object ever ran at once.
    """
    from ._demo import DemoFailed, run_demo

    _select_stack(ctx, stack)
    state = _state(ctx)
    with guard(state):
        try:
            run_demo(state.out, keep=keep, step_timeout=step_timeout, real_node=real_node)
        except DemoFailed as exc:
            state.err.print(f"[bold red]demo failed:[/] {escape(str(exc))}", highlight=False)
            raise typer.Exit(EXIT_FAILURE) from None
