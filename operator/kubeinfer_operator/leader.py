"""Leader election on a coordination.k8s.io Lease, so two operator replicas never both act.

kopf's own peering is not usable for this: replicas of one Deployment share a priority, and
peers of equal priority all freeze. Both replicas here watch (their caches stay warm); only the
Lease holder reconciles. Losing the Lease clears `leading` at once and the elector competes again.

A leader cut off from the apiserver cannot learn that it lost: its renewals hang or fail while a
standby waits out the lease and takes over. So leadership is a term that ends by the clock
(`Term`): RENEW_DEADLINE_SECONDS after the last renewal that succeeded was sent, whatever the election
library's loop is doing. A standby starts no earlier than LEASE_DURATION_SECONDS after it saw that
renewal, which was after it was sent: the old leader stops at least their difference before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

log = logging.getLogger(__name__)
# The library logs every retry of a standby at INFO, and a release as an exception; transitions
# are logged here instead.
logging.getLogger("leaderelection").setLevel(logging.CRITICAL)

LEASE_DURATION_SECONDS = 15
RENEW_DEADLINE_SECONDS = 10
RETRY_PERIOD_SECONDS = 2


# What the gap between the two covers: clock-rate skew between the replicas, and a write already
# sent when the term ends (Kube refuses to start one after it).
assert LEASE_DURATION_SECONDS - RENEW_DEADLINE_SECONDS >= RETRY_PERIOD_SECONDS


class Term:
    """Leadership that lasts `renew_deadline` seconds past the last successful renewal's send time.

    `is_set()` has threading.Event's name, so code that asks "leading?" reads it as before."""

    def __init__(self, renew_deadline: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.renew_deadline = renew_deadline
        self._clock = clock
        self._lock = threading.Lock()
        self._renewed_at: float | None = None
        self._open = False  # renewals count only during a campaign: none after clear()

    def now(self) -> float:
        return self._clock()

    def begin(self) -> None:
        with self._lock:
            self._open, self._renewed_at = True, None

    def renewed(self, sent_at: float) -> None:
        with self._lock:
            if self._open and (self._renewed_at is None or sent_at > self._renewed_at):
                self._renewed_at = sent_at

    def clear(self) -> None:
        with self._lock:
            self._open, self._renewed_at = False, None

    def ends_at(self) -> float | None:
        with self._lock:
            return None if self._renewed_at is None else self._renewed_at + self.renew_deadline

    def is_set(self) -> bool:
        end = self.ends_at()
        return end is not None and self.now() < end


class TermLock(LeaseLock):
    """The library's Lease lock, telling the term when a create or renewal of the Lease succeeded."""

    def __init__(self, name: str, namespace: str, identity: str, term: Term) -> None:
        super().__init__(name, namespace, identity)
        self.term = term

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        sent_at = self.term.now()
        created: bool = super().create(name, namespace, election_record)
        if created:
            self.term.renewed(sent_at)
        return created

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        sent_at = self.term.now()
        updated: bool = super().update(name, namespace, updated_record)
        if updated and updated_record.holder_identity == self.identity:
            self.term.renewed(sent_at)
        return updated


class _Released(Exception):
    """Raised out of the library's leading callback: its only way to stop renewing."""


class Leadership:
    def __init__(self, name: str, namespace: str, identity: str, on_elected: Callable[[], None]) -> None:
        self.leading = Term(RENEW_DEADLINE_SECONDS)
        self.name, self.namespace, self.identity = name, namespace, identity
        self._on_elected = on_elected
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._campaign, name="leader-election", daemon=True)

    def _lead(self) -> None:
        if self._stopped.is_set():  # elected while shutting down: decline (the lease is handed over below)
            raise _Released
        log.info("elected leader as %s", self.identity)
        self._on_elected()
        self._stopped.wait()
        raise _Released

    def _lost(self) -> None:
        self.leading.clear()
        if not self._stopped.is_set():
            log.warning("lost the leader lease; standing by")

    def _campaign(self) -> None:
        while not self._stopped.is_set():
            self.leading.begin()
            config = electionconfig.Config(
                TermLock(self.name, self.namespace, self.identity, self.leading),
                lease_duration=LEASE_DURATION_SECONDS,
                renew_deadline=RENEW_DEADLINE_SECONDS,
                retry_period=RETRY_PERIOD_SECONDS,
                onstarted_leading=self._lead,
                onstopped_leading=self._lost,
            )
            try:
                leaderelection.LeaderElection(config).run()  # returns when the lease is lost or released
            except Exception:  # an API error inside the library ends its loop: stop acting, retry
                log.exception("leader election failed; retrying")
            finally:
                self.leading.clear()
            self._stopped.wait(RETRY_PERIOD_SECONDS)
        self._hand_over()

    def _hand_over(self) -> None:
        """A Lease without a holder is free: the standby takes it on its next retry instead of
        waiting for it to expire."""
        api = client.CoordinationV1Api()
        try:
            if api.read_namespaced_lease(self.name, self.namespace).spec.holder_identity == self.identity:
                api.patch_namespaced_lease(self.name, self.namespace, {"spec": {"holderIdentity": None}})
                log.info("handed the leader lease over")
        except ApiException as error:
            log.warning("could not hand the lease over (it expires by itself): %s", error.reason)

    def start(self) -> None:
        self._thread.start()

    def release(self) -> None:
        """Stop acting now; a leader also stops renewing and hands the Lease over."""
        was_leading = self.leading.is_set()
        self._stopped.set()
        self.leading.clear()
        if was_leading:  # the library notices within a retry period
            self._thread.join(timeout=2 * RETRY_PERIOD_SECONDS + 1)
