"""CLI tests (a package, so the harness module is importable by tests and type checkers alike)."""
