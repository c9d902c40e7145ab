"""``dispatch admin``: identity records, pod finalizers and MultiKueue workers (the dispatch-admin role)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from .._api import PODS
from ._codes import EXIT_CODES_HELP
from ._common import NamespaceOpt, OutputOpt, _state
from ._errors import guard
from ._output import Column, Grid, emit, resource_name, show

admin_app = typer.Typer(
    help="Identity-record and pod-finalizer administration (needs the dispatch-admin role).",
    no_args_is_help=True,
    rich_markup_mode=None,
    add_completion=False,
)


@admin_app.command("forget", epilog=EXIT_CODES_HELP)
def admin_forget(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB_ID")],
    submission: Annotated[str, typer.Argument(metavar="SUBMISSION")],
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: the submission counts from A=1 again.")] = False,
    output: OutputOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Delete a submission's identity record, so a re-opened submission counts from A=1 again.

    Only once no process of it can run and nothing fences on its old admission numbers. Refused while a
    TrainJob holds the submission.
    """
    state = _state(ctx, output, namespace, named=False)
    if not yes:
        raise typer.BadParameter("forgetting a submission lets it reuse admission numbers; pass --yes to confirm",
                                 param_hint="--yes")
    with guard(state):
        forgotten = state.adapter().forget(job_id, submission)

    def human() -> None:
        state.out.print(f"forgot {escape(job_id)}/{escape(submission)}" if forgotten
                        else f"{escape(job_id)}/{escape(submission)} has no identity record")

    emit(state, {"jobId": job_id, "submission": submission, "forgotten": forgotten}, human)


@admin_app.command("release-pod", epilog=EXIT_CODES_HELP)
def admin_release_pod(
    ctx: typer.Context,
    pod: Annotated[str, typer.Argument(metavar="POD")],
    node_confirmed_down: Annotated[bool, typer.Option(
        "--node-confirmed-down",
        help="Confirm the pod's node is shut down (its processes are gone): that is the proof of the pod's end.",
    )] = False,
    process_gone: Annotated[bool, typer.Option(
        "--process-gone",
        help="Confirm the process of a pod someone else marked Failed is gone, now that its node's kubelet "
             "is back (Ready): that is the proof of the pod's end.",
    )] = False,
    output: OutputOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Remove dispatch's finalizer from a pod, so its deletion completes.

    Without --node-confirmed-down only a pod whose end is proven is released (its kubelet confirmed it,
    or its Node is tainted out-of-service and not Ready; a deleted Node proves nothing by itself: its
    kubelet may run on). With it, your word that the node is down is the
    proof: only give it once the machine is confirmed off, as for the out-of-service taint. Refused
    while the pod's Node is Ready. --process-gone is for a pod Kueue's failure recovery or PodGC marked
    Failed while its node was unreachable, once the node's kubelet is back and has written the pod's
    status since dispatch first saw the mark (the first run records the mark on the pod if dispatch's
    controller has not), or once its Node was registered again after the pod was deleted (its kubelet
    restarted): check the process is gone on the node, then give it.
    """
    state = _state(ctx, output, namespace)
    with guard(state):
        end = state.adapter().release_pod(pod, node_confirmed_down=node_confirmed_down, process_gone=process_gone)

    def human() -> None:
        state.out.print(f"released pod {escape(pod)} (end: {end.proof})")

    emit(state, {"pod": pod, "released": True, **end.to_dict()}, human, names=[resource_name(PODS, pod)])


@admin_app.command("worker-down", epilog=EXIT_CODES_HELP)
def admin_worker_down(
    ctx: typer.Context,
    worker: Annotated[str, typer.Argument(metavar="WORKER", help="The MultiKueueCluster's name.")],
    output: OutputOpt = None,
) -> None:
    """Confirm that a MultiKueue worker Kueue has lost is down, on the manager.

    dispatch's check on the manager waits while a worker the previous execution may have run in cannot be
    read: nothing proves its pods stopped. Once you know the worker's machines are off (or its API server
    and nodes are gone for good), this is the proof. It is written on the MultiKueueCluster and names the
    loss Kueue saw (its Active=False transition), so it lapses by itself when the worker comes back.
    Refused for a worker Kueue still reaches.

    A worker removed from the manager (no MultiKueueCluster names it) that identity records still remember: each
    such record, in every namespace, forgets it (with the raise of A its CRD asks for), which is your word that the
    worker runs none of their pods any more. An object Kueue is about to start is left as it is; run this again
    once it has started.
    """
    state = _state(ctx, output, None)
    with guard(state):
        w = state.adapter().worker_down(worker)

    def human() -> None:
        if w.removed:
            state.out.print(f"worker {escape(w.name)} has no MultiKueueCluster; identity records that forgot it: "
                            f"{escape(', '.join(w.forgotten) or 'none')}")
            if w.armed:
                state.out.print(f"left as they were (Kueue is about to start them; run this again once they have "
                                f"started): {escape(', '.join(w.armed))}")
            return
        state.out.print(f"worker {escape(w.name)} confirmed down (Kueue lost it at {escape(w.lost_since)}: "
                        f"{escape(w.reason)})")
        state.out.print(BACK_ORDER.format(worker=escape(w.name)))

    emit(state, w.to_dict(), human)


BACK_ORDER = (
    "before {worker} comes back, delete its copies there: its nodes' kubelets would start them again beside the "
    "execution admitted since, and MultiKueue (Kueue v0.19.2), reaching it again, keeps the copy admitted earliest "
    "and deletes the current one. Take {worker} out of the MultiKueueConfig's spec.clusters, bring its control "
    "plane up with its nodes still off, delete the copies (TrainJob, JobSet, Jobs, the Workload labelled "
    "kueue.x-k8s.io/multikueue-origin) and force-delete their pods, then start its nodes and put it back "
    "(docs: MultiKueue, a worker that cannot be read)")
"""What the operator's word commits to: the worker stays down until its copies are gone (the fleet testbed saw
MultiKueue delete the current copy when a confirmed worker came back with its old one)."""


@admin_app.command("workers", epilog=EXIT_CODES_HELP)
def admin_workers(ctx: typer.Context, output: OutputOpt = None) -> None:
    """List the MultiKueue workers as Kueue sees them, and which are confirmed down."""
    state = _state(ctx, output, None)
    with guard(state):
        workers = state.adapter().workers()

    def human() -> None:
        grid = Grid([Column("WORKER"), Column("KUEUE"), Column("REASON"), Column("LOST SINCE"),
                     Column("CONFIRMED DOWN")])
        for w in workers:
            grid.add([w.name, f"Active={w.active}", w.reason or "-", w.lost_since or "-",
                      "yes" if w.confirmed_down else "no"])
        show(state, grid)

    emit(state, {"items": [w.to_dict() for w in workers]}, human)


@admin_app.command("migrate", epilog=EXIT_CODES_HELP)
def admin_migrate(ctx: typer.Context, output: OutputOpt = None, namespace: NamespaceOpt = None) -> None:
    """Fold the old dispatch-admissions ConfigMap and every dispatch TrainJob's A into identity records.

    Run it once per namespace after upgrading from a version without records; safe to run again.
    """
    state = _state(ctx, output, namespace, named=False)
    with guard(state):
        created, raised = state.adapter().migrate()
    emit(state, {"created": created, "raised": raised},
         lambda: state.out.print(f"identity records: {created} created, {raised} raised"))

