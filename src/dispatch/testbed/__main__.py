"""Command line: ``python -m dispatch.testbed [--stack NAME] COMMAND``.

Commands: build, up, down, status, stacks, freeze NODE, thaw NODE, kubeconfig.
"""

from __future__ import annotations

import argparse
import sys

from dispatch import testbed
from dispatch.testbed import _paths


def main(argv: list[str] | None = None) -> int:
    """Parse the command and run it; exit status 0 on success, 2 for an unknown stack."""
    ap = argparse.ArgumentParser(prog="python -m dispatch.testbed", description=__doc__)
    ap.add_argument(
        "--stack",
        help=f"which stack of versions to build and run (default: ${_paths.STACK_ENV}, else testbed/stacks/default)",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("build", "up", "down", "status", "stacks", "kubeconfig"):
        sub.add_parser(name)
    for name in ("freeze", "thaw"):
        sub.add_parser(name).add_argument("node")
    args = ap.parse_args(argv)
    try:
        if args.stack is not None:
            testbed.select_stack(args.stack)
        testbed.stack()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
