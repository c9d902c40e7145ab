"""Events on the TrainJob for plain mode's verbs, so ``kubectl describe trainjob`` tells the story.

In Kueue mode the controller records why admission waited and when it went; in plain mode the writer that
opens, releases, holds or closes the object is the only one who knows, so the adapter records it here:

==================  ========  ==============================================================
reason              type      when
==================  ========  ==============================================================
Opened              Normal    ``open`` created the TrainJob, held
AdmissionProceeds   Normal    ``release`` admitted execution A (the same reason as Kueue mode)
AdmissionDelayed    Warning   ``release`` refused: pods of the previous execution may still run
Held                Normal    ``hold`` suspended it
Closed              Normal    ``close`` deleted it (naming the pods that remain, if any)
==================  ========  ==============================================================

The builders are pure; :func:`record` sends one, best effort: an Event that cannot be written (no
permission, an API error) is dropped, never allowed to fail the verb it describes.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime

from . import _kube as k
from ._api import TRAINJOBS, Obj, Res
from ._records import RemainingPod
from ._trainer import TrainJobView
from ._views import Ref
from .errors import DispatchError

COMPONENT = "dispatch"
MAX_MESSAGE = 1024


def body(res: Res, ref: Ref, reason: str, message: str, *, warning: bool = False, component: str = COMPONENT,
         instance: str = "", now: datetime | None = None) -> Obj:
    """A core/v1 Event about the object ``ref`` of kind ``res`` (its uid, so ``kubectl describe`` finds it): the
    one Event body, for the verbs' Events and the controller's alike. One about a cluster-scoped object (a
    ClusterQueue) lives in "default", where kubectl looks for it."""
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    out: Obj = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{ref.name}.{secrets.token_hex(8)}", "namespace": ref.namespace or "default"},
        "involvedObject": {"apiVersion": res.api_version, "kind": res.kind, "name": ref.name,
                           **({"namespace": ref.namespace} if ref.namespace else {}),
                           "uid": ref.uid, "resourceVersion": ref.resource_version},
        "reason": reason,
        "message": message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 15] + "... (truncated)",
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    if instance:
        out["reportingInstance"] = instance[:128]
    return out


def event(tj: TrainJobView, reason: str, message: str, *, warning: bool = False,
          now: datetime | None = None) -> Obj:
    """A core/v1 Event about ``tj``, from the verbs."""
    return body(TRAINJOBS, tj.ref, reason, message, warning=warning, now=now)


def opened(tj: TrainJobView) -> Obj:
    ident = tj.identity
    return event(tj, "Opened", f"opened as {ident.job_id}/{ident.submission}, held: `dispatch release` admits it")


def admitted(tj: TrainJobView, admission: int) -> Obj:
    ident = tj.identity
    return event(tj, "AdmissionProceeds", f"no pod of the previous execution remains; admitted as "
                                          f"{ident.job_id}/{ident.submission}#{admission} (A={admission})")


def delayed(tj: TrainJobView, detail: str) -> Obj:
    return event(tj, "AdmissionDelayed", f"release refused, nothing written: {detail}; the previous execution "
                                         "may still run", warning=True)


def held(tj: TrainJobView) -> Obj:
    return event(tj, "Held", "held: suspended; its pods stop, and only `dispatch release` admits it again")


def closed(tj: TrainJobView, remaining: Sequence[RemainingPod]) -> Obj:
    pods = ", ".join(p.describe() for p in remaining)
    tail = f"; remaining pods: {pods} (they block a same-named new object)" if remaining else ""
    return event(tj, "Closed", f"closed: deleted, its A kept in the identity record{tail}")


async def record(kube: k.Kube, event: Obj) -> bool:
    """Send one Event; True if it was written. Never raises for the API's refusal or absence."""
    try:
        await kube.create(k.EVENTS, event, str(event["metadata"]["namespace"]))
    except DispatchError:
        return False
    return True
