"""Command line: ``python -m dispatch.testbed [--stack NAME] COMMAND``.

Commands: build, up, down, status, stacks, freeze NODE, thaw NODE, kubeconfig. ``build`` and ``up`` take
``--no-real-node`` (no kubelet built, no real node started beside the KWOK nodes).

``--clusters`` (on up, down, status) acts on the MultiKueue fleet instead: a manager and two workers beside
the single testbed (``dispatch.testbed.fleet``); ``up --clusters --worker-lost-timeout 30s`` sets Kueue's
``multiKueue:`` block on the manager. ``partition WORKER`` / ``heal WORKER`` stop and start a worker's API
server; ``freeze``/``thaw``/``kubeconfig`` take ``--cluster NAME`` for a fleet's cluster.

``run-image [--detach] [--name N] [--image IMG] [-- ARGS]`` runs the controller's image against the testbed
as a pod of the shipped Deployment runs (its ServiceAccount's token, the CA, the in-cluster environment);
``stop-image N`` stops a detached one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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
    parsers = {}
    for name in ("build", "up"):
        parsers[name] = sub.add_parser(name)
        parsers[name].add_argument(
            "--no-real-node", action="store_true",
            help=f"no real node (kubelet, containerd): neither built nor started (also ${_node.MODE_ENV}=0)")
    for name in ("down", "status", "stacks", "kubeconfig"):
        parsers[name] = sub.add_parser(name)
    for name in ("up", "down", "status"):
        parsers[name].add_argument("--clusters", action="store_true",
                                   help="the MultiKueue fleet (manager, worker-1, worker-2) instead of the testbed")
    parsers["up"].add_argument("--worker-lost-timeout", help="fleet: Kueue's multiKueue.workerLostTimeout (e.g. 30s)")
    parsers["up"].add_argument("--gc-interval", help="fleet: Kueue's multiKueue.gcInterval (e.g. 1m)")
    parsers["up"].add_argument("--origin", help="fleet: Kueue's multiKueue.origin")
    parsers["status"].add_argument("--json", action="store_true", help="one JSON list of the components")
    parsers["kubeconfig"].add_argument("--cluster", help="a fleet's cluster (manager, worker-1, worker-2)")
    for name in ("freeze", "thaw"):
        p = sub.add_parser(name)
        p.add_argument("node")
        p.add_argument("--cluster", help="a fleet's worker (worker-1, worker-2)")
    for name, what in (("partition", "stop a fleet worker's API server"), ("heal", "start it again")):
        sub.add_parser(name, help=what).add_argument("worker")
    for name in ("stop-component", "start-component"):
        sub.add_parser(name, help="stop/start one component of this testbed (e.g. kube-apiserver)").add_argument(
            "component")
    sub.add_parser("reconfigure-kueue", help="restart Kueue with a multiKueue block (JSON)").add_argument(
        "--multikueue", required=True)
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
    try:
        done = _fleet_command(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if done is not None:
        return done
    if args.cmd == "build":
        print(testbed.build())
    elif args.cmd == "up":
        print(testbed.up())
    elif args.cmd == "down":
        testbed.down()
    elif args.cmd == "status" and args.json:
        st = testbed.status()
        print(json.dumps([dataclasses.asdict(s) for s in st]))
        return 0 if all(s.healthy or s.frozen for s in st) else 1
    elif args.cmd == "status":
        st = testbed.status(verbose=True)
        return 0 if all(s.healthy or s.frozen for s in st) else 1
    elif args.cmd == "stop-component":
        testbed.stop_component(args.component)
    elif args.cmd == "start-component":
        testbed.start_component(args.component)
    elif args.cmd == "reconfigure-kueue":
        block = json.loads(args.multikueue)
        if not isinstance(block, dict):
            print("error: --multikueue must be a JSON object", file=sys.stderr)
            return 2
        testbed.reconfigure_kueue({"multiKueue": block})
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


def _fleet_command(args: argparse.Namespace) -> int | None:
    """Run a fleet command (``--clusters``, ``--cluster``, partition, heal); None if ``args`` is not one."""
    from dispatch.testbed import fleet

    if getattr(args, "clusters", False):
        if args.cmd == "up":
            f = fleet.up(worker_lost_timeout=args.worker_lost_timeout, gc_interval=args.gc_interval,
                         origin=args.origin)
            for c in f.clusters:
                print(f"{c.name}\t{c.kubeconfig}")
        elif args.cmd == "down":
            fleet.down()
        else:
            st = fleet.status(verbose=True)
            return 0 if all(rows and all(r["healthy"] or r["frozen"] for r in rows) for rows in st.values()) else 1
        return 0
    if args.cmd == "up" and (args.worker_lost_timeout or args.gc_interval or args.origin):
        raise ValueError("--worker-lost-timeout, --gc-interval and --origin are for the fleet: add --clusters")
    cluster = getattr(args, "cluster", None)
    if args.cmd == "partition":
        fleet.partition(args.worker)
    elif args.cmd == "heal":
        fleet.heal(args.worker)
    elif cluster is None:
        return None
    elif args.cmd == "kubeconfig":
        print(fleet.fleet().cluster(cluster).kubeconfig)
    elif args.cmd == "freeze":
        fleet.freeze(cluster, args.node)
    elif args.cmd == "thaw":
        fleet.thaw(cluster, args.node)
    return 0


if __name__ == "__main__":
    sys.exit(main())
