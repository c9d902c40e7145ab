"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does it.

Leadership only saves work: two replicas that both believe they lead cannot admit twice, because every
admitting write is conditioned on the resourceVersion its decision read. Expiry is judged by when this
replica last *saw the record change* (monotonic clock), not by the holder's timestamps, so clock skew
between replicas cannot make a live leader look expired.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog

from .. import _kube as k
from ..errors import Conflict, DispatchError, NotFound, Refused, Unreachable

log = structlog.get_logger("dispatch.controller.leader")


def _micro(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquire and renew one Lease; call ``on_change(True/False)`` when leadership changes."""

    def __init__(
        self,
        kube: k.Kube,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_seconds: float = 15.0,
        renew_deadline: float = 10.0,
        retry_seconds: float = 2.0,
        on_change: Callable[[bool], None] = lambda _: None,
    ) -> None:
        self._kube = kube
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_deadline = renew_deadline
        self.retry_seconds = retry_seconds
        self._on_change = on_change
        self.is_leader = False
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._last_renew = 0.0
        self._lease: dict[str, Any] | None = None

    def _set(self, leading: bool) -> None:
        if leading != self.is_leader:
            self.is_leader = leading
            log.info("leadership changed", leader=leading, identity=self.identity, lease=self.name)
            self._on_change(leading)

    def _spec(self, transitions: int, acquire: str) -> dict[str, Any]:
        now = _micro(datetime.now(UTC))
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_seconds)),
            "acquireTime": acquire or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    async def try_once(self) -> bool:
        """One acquire-or-renew attempt; returns whether this replica leads afterwards."""
        lease = await self._kube.get_or_none(k.LEASES, self.name, self.namespace)
        now = time.monotonic()
        if lease is None:
            body = {
                "apiVersion": k.LEASES.api_version, "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(0, ""),
            }
            try:
                self._lease = await self._kube.create(k.LEASES, body, self.namespace)
            except Refused as exc:
                if exc.reason == "AlreadyExists":
                    return False
                raise
            self._last_renew = now
            self._observed = None
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"), spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed = record
            self._observed_at = now
        duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
        mine = holder == self.identity
        expired = not holder or now - self._observed_at > duration
        if not mine and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        body = dict(lease)
        body["spec"] = self._spec(transitions, str(spec.get("acquireTime") or "") if mine else "")
        try:
            self._lease = await self._kube.replace(k.LEASES, self.name, body, self.namespace)
        except Conflict:
            return False
        self._last_renew = now
        new = self._lease.get("spec") or {}
        self._observed = (self.identity, new.get("renewTime"), new.get("leaseTransitions"),
                          new.get("leaseDurationSeconds"))
        self._observed_at = now
        return True

    async def run(self) -> None:
        """Campaign and renew until cancelled; leadership lapses if renewals fail past the deadline."""
        try:
            while True:
                try:
                    leading = await self.try_once()
                except NotFound as exc:
                    log.error("cannot lead: the lease namespace does not exist; create it, or pass another "
                              "lease namespace, or run without leader election", namespace=self.namespace,
                              error=str(exc))
                    leading = False
                except DispatchError as exc:
                    log.warning("lease update failed", error=str(exc), lease=self.name)
                    leading = self.is_leader and time.monotonic() - self._last_renew < self.renew_deadline
                self._set(leading)
                await asyncio.sleep(self.retry_seconds)
        finally:
            self._set(False)

    async def release(self) -> None:
        """Give the Lease up at shutdown so a standby takes over at once instead of after expiry."""
        if self._lease is None:
            return
        body = dict(self._lease)
        spec = dict(body.get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            return
        spec["holderIdentity"] = ""
        spec["leaseDurationSeconds"] = 1
        body["spec"] = spec
        try:
            await self._kube.replace(k.LEASES, self.name, body, self.namespace)
        except (Unreachable, NotFound, Refused) as exc:
            log.info("lease not released", error=str(exc))
        self._lease = None
