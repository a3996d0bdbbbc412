"""Leadership ends by the clock: a leader whose renewals fail or hang stops acting before a standby may
start, and a replica out of its term sends no write."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from kubeinfer_operator.kube import Kube, NotLeading
from kubeinfer_operator.leader import (
    LEASE_DURATION_SECONDS,
    RENEW_DEADLINE_SECONDS,
    RETRY_PERIOD_SECONDS,
    Term,
    TermLock,
)


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def term_at(clock: Clock) -> Term:
    term = Term(RENEW_DEADLINE_SECONDS, clock)
    term.begin()
    return term


def test_a_term_lasts_the_renew_deadline_past_the_last_renewal_sent() -> None:
    clock = Clock()
    term = term_at(clock)
    assert not term.is_set()  # elected only once a renewal succeeded
    term.renewed(clock.now)
    clock.now += RENEW_DEADLINE_SECONDS - 0.01
    assert term.is_set()
    clock.now += 0.01
    assert not term.is_set()


def test_a_leader_cut_off_stops_before_a_standby_may_start() -> None:
    """Renewals every retry period until the apiserver is unreachable at `cut`; the standby saw the last
    one at the earliest when it was sent, and may take the Lease a lease duration after it saw it."""
    clock = Clock(0.0)
    term = term_at(clock)
    cut = 31.0
    last_sent = 0.0
    for sent in range(0, int(cut), RETRY_PERIOD_SECONDS):
        term.renewed(float(sent))
        last_sent = float(sent)
    standby_may_start = last_sent + LEASE_DURATION_SECONDS
    clock.now = standby_may_start
    assert not term.is_set()
    assert term.ends_at() is not None
    assert standby_may_start - term.ends_at() >= RETRY_PERIOD_SECONDS  # the margin for skew and writes


def test_a_renewal_that_hangs_counts_from_when_it_was_sent() -> None:
    clock = Clock()
    term = term_at(clock)
    term.renewed(clock.now)
    sent = clock.now + RETRY_PERIOD_SECONDS
    clock.now = sent + RENEW_DEADLINE_SECONDS + 5  # the request came back this late, successful
    term.renewed(sent)
    assert not term.is_set()


def test_nothing_revives_a_cleared_term() -> None:
    clock = Clock()
    term = term_at(clock)
    term.renewed(clock.now)
    term.clear()  # lost, or released at shutdown
    term.renewed(clock.now)  # the library's renewal that was already in flight
    assert not term.is_set()
    term.begin()  # the next campaign
    term.renewed(clock.now)
    assert term.is_set()


@pytest.mark.parametrize(("answer", "leading"), [(True, True), (False, False)])
def test_the_lease_lock_tells_the_term_about_renewals_that_succeeded(
    monkeypatch: pytest.MonkeyPatch, answer: bool, leading: bool
) -> None:
    clock = Clock()
    term = term_at(clock)

    def update(self: LeaseLock, name: str, namespace: str, record: Any) -> bool:
        clock.now += 1.0  # the request takes a second
        return answer

    monkeypatch.setattr(LeaseLock, "update", update)
    lock = TermLock("operator", "system", "me", term)
    record = LeaderElectionRecord("me", str(LEASE_DURATION_SECONDS), "t", "t")
    assert lock.update("operator", "system", record) is answer
    assert term.is_set() is leading
    if leading:
        assert term.ends_at() == clock.now - 1.0 + RENEW_DEADLINE_SECONDS


def test_a_replica_out_of_its_term_sends_no_write_but_still_reads() -> None:
    kube = Kube(None)  # type: ignore[arg-type]  # any request that is sent fails on the missing client
    kube.may_write = lambda: False
    with pytest.raises(NotLeading):
        kube.apply({"kind": "Service", "metadata": {"name": "s", "namespace": "ns"}})
    with pytest.raises(NotLeading):
        kube.patch_status("InferenceService", "ns", "s", {"replicas": 1}, "7")
    with pytest.raises(AttributeError):  # a read is sent (and fails here for want of a client)
        kube.get("Service", "ns", "s")
