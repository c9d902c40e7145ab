"""Exit codes, and one clear message plus a hint for every error a person can expect."""

from __future__ import annotations

import contextlib
import signal
import threading
import traceback
from collections.abc import Iterator
from types import FrameType

from .._decision import UNMANAGED_HINT
from ..errors import (
    DispatchError,
    Forbidden,
    InvalidInput,
    NotFound,
    NotServed,
    PodsRemain,
    ReadOnly,
    Refused,
    Unreachable,
)
from ._codes import (
    CEASED_EXIT_CODES_HELP as CEASED_EXIT_CODES_HELP,
)
from ._codes import EXIT_CODES_HELP as EXIT_CODES_HELP
from ._codes import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    EXIT_RETRY,
)
from ._codes import EXIT_NOT_CEASED as EXIT_NOT_CEASED
from ._codes import EXIT_OK as EXIT_OK
from ._codes import EXIT_USAGE as EXIT_USAGE
from ._state import CliState


def escape(text: str) -> str:
    """rich's markup escape, loaded when a message is printed: a command's requests go out before rich is
    imported (``status NAME`` starts without it)."""
    from rich.markup import escape as escape_markup

    return escape_markup(text)


OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"


def exit_code(exc: DispatchError) -> int:
    """3 for anything worth retrying, 4 for refusals, 1 for anything else."""
    if isinstance(exc, Unreachable):
        return EXIT_RETRY
    if isinstance(exc, Refused):
        return EXIT_REFUSED
    return EXIT_FAILURE


_KUBECONFIG_HINTS = {
    "BadKubeconfig": "fix the kubeconfig entry named above (`kubectl config view` shows how it reads), or point "
                     "--kubeconfig or KUBECONFIG at a working one",
    "BadCertificate": "certificate data must be base64 of PEM (as `kubectl config view --raw` prints it), and files "
                      "must exist and hold PEM; fetch a fresh kubeconfig from your cluster's provider",
    "ExecCredential": "install the credential plugin the kubeconfig names (or put it on PATH), log in with it if it "
                      "needs that, or pick another --context; `kubectl get ns` with the same kubeconfig runs the same "
                      "plugin",
    "BadImpersonation": "impersonate a user with --as (or `as` in the kubeconfig's user); groups and a uid "
                        "(--as-group, --as-uid) go with it",
    "NoKubeconfig": "pass --kubeconfig PATH, set KUBECONFIG, or create ~/.kube/config; for the local testbed run "
                    "`dispatch testbed up`, which prints the kubeconfig path",
}
"""A kubeconfig dispatch could not use, by the error's reason (whatever its class)."""

_REFUSED_HINTS = {
    "AlreadyExists": "choose a new --submission",
    "BadSelector": "write the selector as kubectl's -l: key=value, key!=value, 'key in (a,b)', 'key notin (a)', "
                   "key, !key, joined by commas",
    "NotDispatchObject": UNMANAGED_HINT,
    "RecordInvalid": "see `dispatch admin --help`; an admin restores or forgets the identity record",
    # ``admin release-pod``: dispatch itself refused, for want of a proof; the cluster was not asked.
    "Unproven": "first confirm outside Kubernetes that the machine is shut down (cloud console, IPMI); "
                f"`dispatch ceased` shows what is proven, and the {OUT_OF_SERVICE} taint frees every pod of a node",
    "NodeReady": "wait for its kubelet to end the pod (`dispatch ceased` shows when), or restart it",
    "NotHeld": "only dispatch's own finalizer is released here; others belong to whoever set them",
}
"""A refusal's hint by its reason, where the refusal has no class of its own (those are explained first)."""


def explain(exc: DispatchError) -> tuple[str, str]:
    """(message, hint) for an expected error. The message is the library's own words."""
    message = str(exc)
    if isinstance(exc, PodsRemain):
        return message, (
            "retry once the pods have gone, or run `dispatch release --wait`; a pod on a lost node goes only "
            f"when an operator confirms the node is down and taints it {OUT_OF_SERVICE} (see `dispatch ceased`)"
        )
    if exc.reason == "NoContext" or (
        exc.reason == "NoKubeconfig" and "context" in message.lower() and "not found" in message.lower()
    ):
        return message, "pass --context with a context your kubeconfig defines, or omit it for the current one"
    if exc.reason in _KUBECONFIG_HINTS:
        return message, _KUBECONFIG_HINTS[exc.reason]
    if exc.reason == "NotKubernetesAPI" and isinstance(exc, Unreachable):
        return message, (
            "something in front of the API server (a proxy or load balancer) answered instead of it; this may be "
            "temporary (exit code 3): retry, and check the kubeconfig's server URL if it persists"
        )
    if exc.reason == "NotKubernetesAPI":
        return message, (
            "the kubeconfig's server URL does not reach a Kubernetes API server (a proxy, portal or web server "
            "answered): check the cluster's server in the kubeconfig, --context, and HTTPS_PROXY"
        )
    if isinstance(exc, Unreachable):
        if exc.reason in ("ConnectionError", "Timeout") and "API server" in message:
            return message, (
                "is the cluster running? check --kubeconfig and --context point at it "
                "(this is temporary: exit code 3, safe to retry)"
            )
        if exc.reason == "Timeout":
            return message, "wait longer with --timeout, or run `dispatch status NAME` to see what it waits for"
        return message, "this is temporary: retry the same command (exit code 3)"
    if isinstance(exc, Forbidden):
        if exc.code == 401:
            return message, "your credentials were rejected: refresh them or pick another --context"
        return message, (
            "ask a cluster admin to grant that verb on that resource to your account (RBAC), "
            "or use --context with an account that has it"
        )
    if isinstance(exc, NotFound):
        low = message.lower()
        if isinstance(exc, NotServed) or "trainer installed" in low or "kind is not served" in low:
            return message, (
                "a kind dispatch needs is not served: install Kubeflow Trainer v2 (with JobSet) in the "
                "cluster, and Kueue for --queue; or pick the right cluster with --context"
            )
        if "runtime" in low:
            return message, "pass --runtime with the name of an installed ClusterTrainingRuntime"
        return message, "check the name and --namespace; `dispatch status` lists the objects in the namespace"
    if isinstance(exc, ReadOnly):
        return message, "drop --read-only to write"
    if isinstance(exc, InvalidInput):
        return message, "fix the fields named above; nothing was sent to the cluster"
    if isinstance(exc, Refused):
        if exc.reason in _REFUSED_HINTS:
            return message, _REFUSED_HINTS[exc.reason]
        if "queue" in message.lower() and "kueue" in message.lower():
            return message, "is Kueue installed, and does the LocalQueue exist in this namespace?"
        return message, "the cluster refused the request; retrying it unchanged will fail the same way"
    return message, "see --debug for details"


def report(state: CliState, exc: DispatchError) -> int:
    """Print the error (with its traceback under --debug); return the exit code."""
    if state.settings.debug:
        state.err.print(escape("".join(traceback.format_exception(exc))), highlight=False)
    message, hint = explain(exc)
    state.err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    if hint:
        state.err.print(f"[yellow]hint:[/] {escape(hint)}", highlight=False)
    return exit_code(exc)


def outcome(state: CliState, exc: BaseException) -> int | None:
    """The exit code of an expected error (a ``DispatchError``, Ctrl-C), its message printed; None for any other
    exception (the caller lets it go on). ``guard`` and the parser-less ``status NAME`` (``_plain``) share it."""
    if isinstance(exc, DispatchError):
        return report(state, exc)
    if isinstance(exc, KeyboardInterrupt):
        state.err.print("interrupted; nothing was left half-written", highlight=False)
        return EXIT_INTERRUPTED
    return None


@contextlib.contextmanager
def guard(state: CliState) -> Iterator[None]:
    """Turn expected errors into a message and an exit code; Ctrl-C into exit 130."""
    try:
        yield
    except (DispatchError, KeyboardInterrupt) as exc:
        import typer  # loaded already wherever a command runs through the parser

        code = outcome(state, exc)
        assert code is not None  # an expected error has a code
        raise typer.Exit(code) from None


class Interrupts:
    """Defer Ctrl-C while a call runs, so a write is never cut in half; re-raise it after the call."""

    def __init__(self) -> None:
        self.pending = False

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def note(signum: int, frame: FrameType | None) -> None:
            self.pending = True

        previous = signal.signal(signal.SIGINT, note)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
        if self.pending:
            raise KeyboardInterrupt
