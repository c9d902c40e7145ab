"""The command line's table of commands and its global flags, readable without loading the command line's
parser (typer): ``dispatch --help`` and a completion TAB read them as they are."""

from __future__ import annotations

from typing import NamedTuple


class Entry(NamedTuple):
    """Where a command lives, and the first paragraph of its help (what ``dispatch --help`` lists without
    loading it; a test holds it equal to the command's own)."""

    module: str
    attr: str
    help: str
    group: bool = False
    starts: bool = False
    """It starts something (an execution, a controller, a testbed): never offered for a mistyped verb."""
    names_object: bool = False
    """Its first argument names a TrainJob (``NAME``): a TAB right after the command lists the namespace's
    TrainJobs without loading the parser (a test holds this equal to the command's own first argument)."""


COMMANDS: dict[str, Entry] = {
    "open": Entry("_open", "commands", "Create a TrainJob for one submission, held unless --no-hold.", starts=True),
    "release": Entry("_commands", "commands", "Admit a held object if no pod of it may still run (A rises by one); "
                     "else exit 3, nothing written.", starts=True, names_object=True),
    "hold": Entry("_commands", "commands", "Suspend an object (Kueue mode: deactivate its Workload). Its pods then "
                  "start to go.", names_object=True),
    "close": Entry("_commands", "commands", "Delete an object. Lists pods that remain: they still block a "
                   "same-named new object.", names_object=True),
    "status": Entry("_commands", "commands", "Inspect one object, or find many: state, identity with A, age and "
                    "cause.", names_object=True),
    "find": Entry("_commands", "commands", "List objects with their state, identity, A, age and cause (`status` "
                  "without a NAME)."),
    "ceased": Entry("_commands", "commands", "Whether the object's processes are proven gone (writes nothing; "
                    "needs get on Nodes).", names_object=True),
    "wait": Entry("_commands", "commands", "Wait until the object is in one of the given states; print its "
                  "status.", names_object=True),
    "logs": Entry("_commands", "commands", "Print the trainer logs of one node of the object.", names_object=True),
    "completion": Entry("_commands", "commands", "Print the shell completion script for bash, zsh or fish "
                        "(commands, options, object names, namespaces, contexts)."),
    "controller": Entry("_controller", "commands", "Run the Kueue admission-check controller until SIGTERM or "
                        "Ctrl-C (long-running).", starts=True),
    "demo": Entry("_testbed", "commands", "Walk through the promise on the local testbed (built and started if "
                  "needed).", starts=True),
    "testbed": Entry("_testbed", "testbed_app", "The local real control plane (etcd, kube-apiserver, controllers, "
                     "KWOK nodes) for trying dispatch.", group=True, starts=True),
    "admin": Entry("_admin", "admin_app", "Identity-record and pod-finalizer administration (needs the "
                   "dispatch-admin role).", group=True),
}
"""Every command, in the order ``--help`` lists them."""

ALIASES = {"get": "status"}
"""kubectl's verbs that mean a dispatch command: ``dispatch get NAME`` is ``dispatch status NAME``."""
KUBECTL_VERBS = {
    "describe": "`dispatch status NAME` shows the object's state, cause, A and the pods that remain (-o yaml for "
                "every field); `kubectl describe trainjob NAME` adds its Events",
    "delete": "`dispatch close NAME` deletes the object and lists the pods that remain",
}
"""kubectl's verbs dispatch answers with a usage error naming its own verb (nothing is run)."""


GLOBAL_VALUES = frozenset({"--kubeconfig", "--context", "--request-timeout", "--as", "--as-group", "--as-uid",
                           "--token", "--server", "-s", "--cluster", "--user", "--certificate-authority",
                           "--tls-server-name", "-v", "--v"})
"""kubectl's client flags that take a value, taken before or after the command (as kubectl takes them)."""
GLOBAL_FLAGS = frozenset({"--insecure-skip-tls-verify", "--read-only", "--debug"})
"""Global switches, taken anywhere too."""


def hoist(args: list[str]) -> list[str]:
    """``args`` with every global flag (and its value) moved to the front, where the root command reads it:
    ``status x --context y`` is ``--context y status x``. Everything after ``--`` stays where it is."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest.extend(args[i:])
            break
        name, eq, value = arg.partition("=")
        if name in GLOBAL_VALUES:
            if eq:
                front += [name, value]  # -v=6 as well as --context=x (click reads no '=' after a short flag)
            else:
                front += args[i:i + 2]
                i += 1
        elif name.startswith("-v") and not name.startswith("--") and name[2:].isdigit():
            front += ["-v", name[2:]]  # -v6
        elif name in GLOBAL_FLAGS:
            if name == "--insecure-skip-tls-verify" and eq:
                if value.lower() not in ("true", "false"):
                    front.append(arg)  # click names the bad value
                elif value.lower() == "true":
                    front.append(name)
            else:
                front.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest
