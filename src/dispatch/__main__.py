"""``python -m dispatch``: the ``dispatch`` command, for hosts where the console script is not on PATH."""

from dispatch.cli import main

if __name__ == "__main__":
    main(prog_name=None)
