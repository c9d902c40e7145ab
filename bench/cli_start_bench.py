"""How long the ``dispatch`` command takes to start, as ratios to a bare ``python -c pass`` in the same run.

Each figure is the median (and the minimum) of ``--rounds`` warm runs (bytecode compiled, files in the page
cache: one untimed run of each comes first), in ms and as a ratio to the floor measured in the same run,
interleaved round by round so that a change of the machine's load touches every figure alike:

* ``--version`` and ``--help``: the whole process, start to exit.
* ``status NAME``: from the process's start to its first request reaching an API server (a local HTTP
  server in this process, named by a kubeconfig; it answers 404 and the command ends), and to its exit.
* references: ``import typer.main`` (what ``--help`` cannot avoid), the third-party modules first estimated
  for ``status NAME`` (``THIRD_PARTY``), those it does load before its first request
  (``STATUS_THIRD_PARTY``: the part of its start that is not dispatch's), those it loaded while the parser
  read every line (``STATUS_THIRD_PARTY_PARSER``) and before its plain values were converted without typer's
  pydantic adapters (``STATUS_THIRD_PARTY_BEFORE``).
* The kubeconfig is YAML with several clusters and users (``kubeconfig_text``), as a developer's is.
* a completion TAB: ``dispatch sta<TAB>`` as the shells' scripts ask it (``dispatch __complete sta``), and
  ``status lla<TAB>`` (object names, listed from the same local server).

Targets (issue 37): ``--version`` and ``--help`` at most 150 ms, ``status NAME`` at most 150 ms before its
first request, a completion TAB at most 200 ms. The machine's load is printed with the figures.

    python bench/cli_start_bench.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ENTRY = "import sys; sys.argv[0] = 'dispatch'; from dispatch.cli import main; sys.exit(main())"
"""What the ``dispatch`` console script runs (pip's generated script imports ``main`` and calls it)."""


THIRD_PARTY = ("import typer.main, pydantic, rich.console, rich.table, httpx2, asyncio, yaml, msgspec, ssl; "
               "ssl.create_default_context()")
"""The third-party part of ``status NAME``'s start as first estimated (typer 0.29 converts each parameter's value
with pydantic): kept as the reference earlier runs printed."""

STATUS_THIRD_PARTY = ("import httpx2, httpcore2, asyncio, yaml, msgspec, ssl, threading, anyio._backends._asyncio, "
                      "anyio._core._sockets")
"""What ``status NAME`` itself loads of other packages before its first request (read from ``sys.modules`` as the
request leaves): httpx2's transport and httpcore2 (and with them h11, anyio and its asyncio backend, truststore,
and the ``importlib.metadata`` their versions are read with), the YAML reader of the kubeconfig. rich prints
after the answer; a plain line loads no parser (``cli._plain``). The floor under which no change to dispatch's
own modules can bring the command."""

STATUS_FLOOR = f"import gc; gc.disable(); {STATUS_THIRD_PARTY}; import os; os._exit(0)"
"""``STATUS_THIRD_PARTY`` as the plain ``status NAME`` line loads it (the cyclic collector off) and timed to the
end of its imports, as the first request is (the other references also time the interpreter's teardown, ~20-30
ms with these modules loaded): the floor ``status NAME (to 1st request)`` compares with."""

STATUS_THIRD_PARTY_PARSER = STATUS_THIRD_PARTY + ", typer.main"
"""What it loaded with the parser (before ``cli._plain``): typer too."""

STATUS_THIRD_PARTY_BEFORE = STATUS_THIRD_PARTY_PARSER + ", typer._adapters, pydantic.plugin._loader"
"""What it loaded before ``cli._coerce``: typer built a pydantic ``TypeAdapter`` for each parameter it converted
(``typer._adapters`` imports most of pydantic, whose plugin loader reads the installed packages' metadata)."""


def kubeconfig_text(port: int) -> str:
    """A developer's kubeconfig as kind and cloud CLIs write it: YAML, the bench's cluster (plain HTTP, to the
    local server) beside others with their CA data, so reading it costs what reading a real one costs."""
    import base64

    def data(seed: int, size: int) -> str:
        return base64.b64encode(bytes((seed * 31 + i) % 256 for i in range(size))).decode()

    clusters = [f"- name: bench\n  cluster:\n    server: http://127.0.0.1:{port}\n"]
    clusters += [f"- name: other-{i}\n  cluster:\n    certificate-authority-data: {data(i, 1100)}\n"
                 f"    server: https://10.0.{i}.1:6443\n" for i in range(4)]
    users = ["- name: bench\n  user: {}\n"]
    users += [f"- name: other-{i}\n  user:\n    client-certificate-data: {data(i + 10, 1200)}\n"
              f"    client-key-data: {data(i + 20, 1700)}\n" for i in range(4)]
    contexts = ["- name: bench\n  context:\n    cluster: bench\n    user: bench\n    namespace: default\n"]
    contexts += [f"- name: other-{i}\n  context:\n    cluster: other-{i}\n    user: other-{i}\n" for i in range(4)]
    return ("apiVersion: v1\nkind: Config\ncurrent-context: bench\npreferences: {}\n"
            f"clusters:\n{''.join(clusters)}users:\n{''.join(users)}contexts:\n{''.join(contexts)}")


class FirstRequest(http.server.BaseHTTPRequestHandler):
    """Records when each request arrives; answers the API server's 404 Status (the command then ends)."""

    arrivals: list[float] = []  # noqa: RUF012 - one list shared by the server's handlers
    objects: list[str] = []  # noqa: RUF012

    def do_GET(self) -> None:
        FirstRequest.arrivals.append(time.perf_counter())
        if self.path.split("?")[0].endswith("/trainjobs"):  # a list: the names completion offers
            body = {"kind": "TrainJobList", "apiVersion": "trainer.kubeflow.org/v1alpha1",
                    "metadata": {"resourceVersion": "1"},
                    "items": [{"metadata": {"name": n, "namespace": "default"}} for n in FirstRequest.objects]}
            self._answer(200, body)
            return
        self._answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                           "code": 404, "message": "not found"})

    def _answer(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def run(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from start to exit."""
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def to_first_request(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from start to the first request's arrival at the local server."""
    FirstRequest.arrivals.clear()
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    if not FirstRequest.arrivals:
        raise SystemExit(f"{argv[3:]} sent no request to the local server")
    return FirstRequest.arrivals[0] - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FirstRequest)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FirstRequest.objects = ["llama-s1", "llama-s2", "mistral-s1"]
    tmp = Path(tempfile.mkdtemp(prefix="dispatch-cli-bench-"))
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(kubeconfig_text(server.server_port))
    # PYTHONDONTWRITEBYTECODE would compile every module from source in every run: not a warm start
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("_DISPATCH", "COMP_")) and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(KUBECONFIG=str(kubeconfig), COLUMNS="120")
    py = [sys.executable, "-c"]
    cases: dict[str, Callable[[], float]] = {
        "python -c pass": lambda: run([*py, "pass"], env),
        "import typer": lambda: run([*py, "import typer.main"], env),
        "import what status needs (no dispatch)": lambda: run([*py, THIRD_PARTY], env),
        "import what status loads (no dispatch)": lambda: run([*py, STATUS_THIRD_PARTY], env),
        "floor: the same, to the end of imports": lambda: run([*py, STATUS_FLOOR], env),
        "what status loaded with typer": lambda: run([*py, STATUS_THIRD_PARTY_PARSER], env),
        "what status loaded before (pydantic)": lambda: run([*py, STATUS_THIRD_PARTY_BEFORE], env),
        "dispatch --version": lambda: run([*py, ENTRY, "--version"], env),
        "dispatch --help": lambda: run([*py, ENTRY, "--help"], env),
        "dispatch status NAME (to 1st request)": lambda: to_first_request([*py, ENTRY, "status", "llama-s1"], env),
        "dispatch status NAME (to exit)": lambda: run([*py, ENTRY, "status", "llama-s1"], env),
        "TAB: dispatch sta<TAB>": lambda: run([*py, ENTRY, "__complete", "sta"], env),
        "TAB: dispatch status lla<TAB>": lambda: run([*py, ENTRY, "__complete", "status", "lla"], env),
    }
    targets = {"dispatch --version": 150, "dispatch --help": 150, "dispatch status NAME (to 1st request)": 150,
               "TAB: dispatch sta<TAB>": 200, "TAB: dispatch status lla<TAB>": 200}
    for case in cases.values():  # warm: bytecode written, files cached
        case()
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, case in cases.items():
            times[name].append(case() * 1000)
    server.shutdown()
    floor = statistics.median(times["python -c pass"])
    load = os.getloadavg()
    print(f"load: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} before, {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f} after ({os.cpu_count()} cores); python {sys.version.split()[0]}; {args.rounds} rounds")
    print(f"{'case':40} {'median ms':>10} {'min ms':>8} {'ratio':>7} {'target ms':>10}")
    for name, values in times.items():
        med = statistics.median(values)
        target = targets.get(name)
        mark = "" if target is None else ("  ok" if med <= target else "  over")
        print(f"{name:40} {med:10.1f} {min(values):8.1f} {med / floor:7.2f} "
              f"{'' if target is None else target:>10}{mark}")


if __name__ == "__main__":
    main()
