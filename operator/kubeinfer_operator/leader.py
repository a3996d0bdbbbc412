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


class _Released(Exception):
    """Raised out of the library's leading callback: its only way to stop renewing."""


class Leadership:
    def __init__(self, name: str, namespace: str, identity: str, on_elected: Callable[[], None]) -> None:
        self.leading = threading.Event()
        self.name, self.namespace, self.identity = name, namespace, identity
        self._on_elected = on_elected
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._campaign, name="leader-election", daemon=True)

    def _lead(self) -> None:
        if self._stopped.is_set():  # elected while shutting down: decline (the lease is handed over below)
            raise _Released
        log.info("elected leader as %s", self.identity)
        self.leading.set()
        self._on_elected()
        self._stopped.wait()
        raise _Released

    def _lost(self) -> None:
        self.leading.clear()
        if not self._stopped.is_set():
            log.warning("lost the leader lease; standing by")

    def _campaign(self) -> None:
        while not self._stopped.is_set():
            config = electionconfig.Config(
                LeaseLock(self.name, self.namespace, self.identity),
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
