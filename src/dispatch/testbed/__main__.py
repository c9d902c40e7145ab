"""Command line: ``python -m dispatch.testbed [--stack NAME] COMMAND``.

Commands: build, up, down, status, stacks, freeze NODE, thaw NODE, kubeconfig. ``build`` and ``up`` take
``--no-real-node`` (no kubelet built, no real node started beside the KWOK nodes).

``run-image [--detach] [--name N] [--image IMG] [-- ARGS]`` runs the controller's image against the testbed
as a pod of the shipped Deployment runs (its ServiceAccount's token, the CA, the in-cluster environment);
``stop-image N`` stops a detached one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from dispatch import testbed
from dispatch.testbed import _node, _paths


def main(argv: list[str] | None = None) -> int:
    """Parse the command and run it; exit status 0 on success, 2 for an unknown stack."""
    ap = argparse.ArgumentParser(prog="python -m dispatch.testbed", description=__doc__)
    ap.add_argument(
        "--stack",
        help=f"which stack of versions to build and run (default: ${_paths.STACK_ENV}, else testbed/stacks/default)",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("build", "up"):
        sub.add_parser(name).add_argument(
            "--no-real-node", action="store_true",
            help=f"no real node (kubelet, containerd): neither built nor started (also ${_node.MODE_ENV}=0)")
    for name in ("down", "status", "stacks", "kubeconfig"):
        sub.add_parser(name)
    for name in ("freeze", "thaw"):
        sub.add_parser(name).add_argument("node")
    ri = sub.add_parser("run-image", help="run the controller image as the Deployment's pod would")
    ri.add_argument("--image", default=None, help="default: localhost/dispatch-controller:<version>")
    ri.add_argument("--name", default="dispatch-controller")
    ri.add_argument("--detach", action="store_true", help="start in the background and print the name")
    ri.add_argument("args", nargs=argparse.REMAINDER, help="controller arguments (default: the Deployment's)")
    sub.add_parser("stop-image").add_argument("name", nargs="?", default="dispatch-controller")
    args = ap.parse_args(argv)
    try:
        if args.stack is not None:
            testbed.select_stack(args.stack)
        testbed.stack()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if getattr(args, "no_real_node", False):
        os.environ[_node.MODE_ENV] = "0"  # the build script and every child see it too
    if args.cmd == "build":
        print(testbed.build())
    elif args.cmd == "up":
        print(testbed.up())
    elif args.cmd == "down":
        testbed.down()
    elif args.cmd == "status":
        st = testbed.status(verbose=True)
        return 0 if all(s.healthy or s.frozen for s in st) else 1
    elif args.cmd == "stacks":
        for name in testbed.stacks():
            v = testbed.versions(name)
            mark = "*" if name == testbed.stack() else " "
            pins = " ".join(f"{k.removesuffix('_VERSION').lower()}={val}" for k, val in v.items())
            print(f"{mark} {name:10} {pins}")
    elif args.cmd == "kubeconfig":
        print(testbed.kubeconfig_path())
    elif args.cmd == "freeze":
        testbed.freeze(args.node)
    elif args.cmd == "thaw":
        testbed.thaw(args.node)
    elif args.cmd == "run-image":
        from dispatch.testbed import _container as c

        why = c.podman_missing()
        if why:
            print(f"run-image: {why}", file=sys.stderr)
            return 1
        extra = args.args[1:] if args.args[:1] == ["--"] else args.args
        argv = c.podman_argv(extra or None, image=args.image, name=args.name, detach=args.detach)
        if args.detach:
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
            print(args.name)
        else:
            try:
                return subprocess.run(argv, check=False).returncode
            except KeyboardInterrupt:
                return 130
            finally:
                c.stop(args.name)
    elif args.cmd == "stop-image":
        from dispatch.testbed import _container as c

        c.stop(args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
