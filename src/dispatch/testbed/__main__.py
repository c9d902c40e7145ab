"""Command line: ``python -m dispatch.testbed {build,up,down,status,freeze NODE,thaw NODE,kubeconfig}``."""

from __future__ import annotations

import argparse
import sys

from dispatch import testbed


def main(argv: list[str] | None = None) -> int:
    """Parse the command and run it; exit status 0 on success."""
    ap = argparse.ArgumentParser(prog="python -m dispatch.testbed", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("build", "up", "down", "status", "kubeconfig"):
        sub.add_parser(name)
    for name in ("freeze", "thaw"):
        sub.add_parser(name).add_argument("node")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        print(testbed.build())
    elif args.cmd == "up":
        print(testbed.up())
    elif args.cmd == "down":
        testbed.down()
    elif args.cmd == "status":
        st = testbed.status(verbose=True)
        return 0 if all(s.healthy or s.frozen for s in st) else 1
    elif args.cmd == "kubeconfig":
        print(testbed.kubeconfig_path())
    elif args.cmd == "freeze":
        testbed.freeze(args.node)
    elif args.cmd == "thaw":
        testbed.thaw(args.node)
    return 0


if __name__ == "__main__":
    sys.exit(main())
