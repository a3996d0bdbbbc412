"""Leader election on a coordination.k8s.io Lease, so two operator replicas never both act.

kopf's own peering is not usable for this: replicas of one Deployment share a priority, and
peers of equal priority all freeze. Both replicas here watch (their caches stay warm); only the
Lease holder reconciles. Losing the Lease clears `leading` at once and the elector competes again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kubernetes import client
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

log = logging.getLogger(__name__)
# The library logs every retry of a standby at INFO; transitions are logged here instead.
logging.getLogger("leaderelection").setLevel(logging.WARNING)

LEASE_DURATION_SECONDS = 15
RENEW_DEADLINE_SECONDS = 10
RETRY_PERIOD_SECONDS = 2


class Leadership:
    def __init__(self, name: str, namespace: str, identity: str, on_elected: Callable[[], None]) -> None:
        self.leading = threading.Event()
        self._lock = (name, namespace, identity)
        self._on_elected = on_elected
        self._stopped = threading.Event()

    def _elected(self) -> None:
        log.info("elected leader as %s", self._lock[2])
        self.leading.set()
        self._on_elected()

    def _lost(self) -> None:
        self.leading.clear()
        if not self._stopped.is_set():
            log.warning("lost the leader lease; standing by")

    def _campaign(self) -> None:
        name, namespace, identity = self._lock
        while not self._stopped.is_set():
            config = electionconfig.Config(
                LeaseLock(name, namespace, identity),
                lease_duration=LEASE_DURATION_SECONDS,
                renew_deadline=RENEW_DEADLINE_SECONDS,
                retry_period=RETRY_PERIOD_SECONDS,
                onstarted_leading=self._elected,
                onstopped_leading=self._lost,
            )
            try:
                leaderelection.LeaderElection(config).run()  # returns when the lease is lost
            except Exception:  # an API error inside the library ends its loop: stop acting, retry
                log.exception("leader election failed; retrying")
            finally:
                self.leading.clear()
            self._stopped.wait(RETRY_PERIOD_SECONDS)

    def start(self) -> None:
        threading.Thread(target=self._campaign, name="leader-election", daemon=True).start()

    def release(self) -> None:
        """Stop, and hand the Lease over at once rather than after it expires."""
        was_leading = self.leading.is_set()
        self._stopped.set()
        self.leading.clear()
        if was_leading:
            name, namespace, _ = self._lock
            # A Lease without a holder is free: the standby takes it on its next retry.
            client.CoordinationV1Api().patch_namespaced_lease(
                name, namespace, {"spec": {"holderIdentity": None}}
            )
