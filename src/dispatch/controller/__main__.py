"""``python -m dispatch.controller``: the container's entry point, independent of the CLI's options parser.

Its options are ``ControllerOptions``' (the same as ``dispatch controller``'s), parsed with argparse."""

from __future__ import annotations

from .._controller_options import parse
from . import run_from_cli


def main(argv: list[str] | None = None) -> int:
    return run_from_cli(parse(argv, prog="dispatch-controller", description=__doc__))


if __name__ == "__main__":
    raise SystemExit(main())
