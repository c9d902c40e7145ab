"""Completion that completes (issue 38): object names, namespaces and contexts, as kubectl completes them,
through the real entry point (``dispatch __complete``, what every shell script and kubectl ask) against a
local HTTP server standing in for the API server."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

ROOT = Path(__file__).resolve().parents[2]


class Api(http.server.BaseHTTPRequestHandler):
    """Lists TrainJobs per namespace and the namespaces; records each path asked for."""

    objects: ClassVar[dict[str, list[str]]] = {"default": ["llama-s1", "llama-s2", "mistral-s1"], "team-a": ["bert-s1"]}
    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        Api.paths.append(path)
        if path == "/api/v1/namespaces":
            items = [{"metadata": {"name": n}} for n in sorted(self.objects)]
        elif path.endswith("/trainjobs"):
            namespace = path.split("/namespaces/")[1].split("/")[0]
            items = [{"metadata": {"name": n, "namespace": namespace}} for n in self.objects.get(namespace, [])]
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps({"kind": "List", "metadata": {"resourceVersion": "7"}, "items": items}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    path = tmp_path / "config"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}},
                     {"name": "gone", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "me", "user": {}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "me"}},
                     {"name": "prod", "context": {"cluster": "gone", "user": "me"}}],
    }))
    Api.paths.clear()
    yield path
    server.shutdown()
    server.server_close()


def complete(kubeconfig: Path, *words: str) -> tuple[list[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("_DISPATCH", "DISPATCH_"))}
    env.update(KUBECONFIG=str(kubeconfig), PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "-c", "from dispatch.cli import main; main()", "__complete", *words],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    *found, directive = proc.stdout.splitlines()
    return found, directive


def test_object_names_of_the_namespace(kubeconfig: Path) -> None:
    assert complete(kubeconfig, "status", "ll") == (["llama-s1", "llama-s2"], ":4")
    assert complete(kubeconfig, "release", "") == (["llama-s1", "llama-s2", "mistral-s1"], ":4")
    assert complete(kubeconfig, "-n", "team-a", "hold", "")[0] == ["bert-s1"]
    assert complete(kubeconfig, "close", "--namespace=team-a", "b")[0] == ["bert-s1"]  # the flag after the command
    assert Api.paths[-1].endswith("/namespaces/team-a/trainjobs")
    assert complete(kubeconfig, "get", "m") == (["mistral-s1"], ":4")  # kubectl's verb, as status
    assert complete(kubeconfig, "logs", "llama-s2") == (["llama-s2"], ":4")
    assert complete(kubeconfig, "find", "") == ([], ":4")  # no NAME argument


def test_namespaces_and_contexts(kubeconfig: Path) -> None:
    assert complete(kubeconfig, "status", "-n", "")[0] == ["default", "team-a"]
    assert complete(kubeconfig, "--context", "")[0] == ["lab", "prod"]
    assert complete(kubeconfig, "status", "x", "--context=p")[0] == ["--context=prod"]
    assert complete(kubeconfig, "--cluster", "g")[0] == ["gone"]


def test_a_cluster_that_does_not_answer_completes_nothing_quietly(kubeconfig: Path) -> None:
    assert complete(kubeconfig, "--context", "prod", "status", "") == ([], ":4")


def test_a_file_option_leaves_it_to_the_shell(kubeconfig: Path) -> None:
    assert complete(kubeconfig, "--kubeconfig", "") == ([], ":0")
    assert complete(kubeconfig, "open", "-f", "") == ([], ":0")


def test_a_second_argument_is_not_an_object_name(kubeconfig: Path) -> None:
    assert complete(kubeconfig, "status", "llama-s1", "") == ([], ":4")
