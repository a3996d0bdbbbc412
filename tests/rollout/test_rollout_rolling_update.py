"""RollingUpdate within the GPU budget, step by step: what each revision's Deployment is scaled to."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kubeinfer_operator.rollout.rolling_update import RevisionReplicas, next_replicas, unavailable_allowed


@dataclass
class Cluster:
    """Deployments per revision on a cluster with `gpus` GPUs (one a replica). A pod that gets a GPU is
    Ready one tick later unless its revision is broken; a removed pod frees its GPU at once; pods of a
    Deployment scaled down go not-Ready ones first, as the ReplicaSet controller picks them."""

    desired: int
    surge: int
    unavailable: int
    gpus: int
    spec: dict[str, int] = field(default_factory=dict)
    ready: dict[str, int] = field(default_factory=dict)
    starting: dict[str, int] = field(default_factory=dict)  # scheduled, model loading
    broken: set[str] = field(default_factory=set)
    requested: list[int] = field(default_factory=list)  # replicas asked for across revisions, per tick
    serving: list[int] = field(default_factory=list)  # Ready replicas, per tick

    def pods(self, revision: str) -> int:
        return self.ready.get(revision, 0) + self.starting.get(revision, 0)

    def tick(self, new: str) -> dict[str, int]:
        old = [self.view(r) for r in self.spec if r != new]
        counts = next_replicas(self.desired, self.surge, self.unavailable, self.view(new), old)
        self.spec = {r: n for r, n in counts.items() if n > 0 or r == new}
        for revision in list(self.ready):  # scale down: not-Ready pods go first
            extra = self.pods(revision) - self.spec.get(revision, 0)
            unready = min(extra, self.starting.get(revision, 0)) if extra > 0 else 0
            self.starting[revision] = self.starting.get(revision, 0) - unready
            self.ready[revision] -= max(0, extra - unready)
        for revision, starting in list(self.starting.items()):  # loads finish
            if revision not in self.broken:
                self.ready[revision] = self.ready.get(revision, 0) + starting
                self.starting[revision] = 0
        for revision, wanted in self.spec.items():  # the scheduler places what fits
            free = self.gpus - sum(self.pods(r) for r in self.spec)
            placed = max(0, min(wanted - self.pods(revision), free))
            self.starting[revision] = self.starting.get(revision, 0) + placed
            self.ready.setdefault(revision, 0)
        self.requested.append(sum(self.spec.values()))
        self.serving.append(sum(self.ready.values()))
        return counts

    def view(self, revision: str) -> RevisionReplicas:
        return RevisionReplicas(revision, self.spec.get(revision, 0), self.ready.get(revision, 0))

    def roll(self, new: str, ticks: int = 50) -> None:
        for _ in range(ticks):
            self.tick(new)
            if self.spec == {new: self.desired} and self.ready.get(new) == self.desired:
                return
        raise AssertionError(f"rollout to {new} did not finish: {self.spec}, ready {self.ready}")


def serving(desired: int, revision: str = "old", **kwargs: int) -> Cluster:
    cluster = Cluster(desired, **kwargs)
    cluster.spec = {revision: desired}
    cluster.ready = {revision: desired}
    return cluster


def test_with_no_spare_gpu_one_old_replica_goes_then_one_new_comes() -> None:
    old = RevisionReplicas("old", 3, 3)
    assert next_replicas(3, 0, 1, RevisionReplicas("new", 0, 0), [old]) == {"new": 0, "old": 2}
    old = RevisionReplicas("old", 2, 2)
    assert next_replicas(3, 0, 1, RevisionReplicas("new", 0, 0), [old]) == {"new": 1, "old": 2}
    # The new replica is loading: nothing more goes.
    assert next_replicas(3, 0, 1, RevisionReplicas("new", 1, 0), [old]) == {"new": 1, "old": 2}
    # It is Ready: the next old one goes, and only then the next new one starts.
    assert next_replicas(3, 0, 1, RevisionReplicas("new", 1, 1), [old]) == {"new": 1, "old": 1}
    old = RevisionReplicas("old", 1, 1)
    assert next_replicas(3, 0, 1, RevisionReplicas("new", 1, 1), [old]) == {"new": 2, "old": 1}
    assert next_replicas(3, 0, 1, RevisionReplicas("new", 2, 2), [old]) == {"new": 2, "old": 0}
    assert next_replicas(3, 0, 1, RevisionReplicas("new", 2, 2), []) == {"new": 3}


def test_with_one_spare_gpu_a_new_replica_is_ready_before_an_old_one_goes() -> None:
    old = RevisionReplicas("old", 3, 3)
    assert next_replicas(3, 1, 0, RevisionReplicas("new", 0, 0), [old]) == {"new": 1, "old": 3}
    assert next_replicas(3, 1, 0, RevisionReplicas("new", 1, 0), [old]) == {"new": 1, "old": 3}
    assert next_replicas(3, 1, 0, RevisionReplicas("new", 1, 1), [old]) == {"new": 1, "old": 2}
    old = RevisionReplicas("old", 2, 2)
    assert next_replicas(3, 1, 0, RevisionReplicas("new", 1, 1), [old]) == {"new": 2, "old": 2}


@pytest.mark.parametrize(("surge", "unavailable"), [(0, 1), (1, 0), (2, 0), (1, 1), (0, 2)])
@pytest.mark.parametrize("desired", [1, 3, 5])
def test_a_whole_rollout_stays_within_the_budget_and_the_availability(
    desired: int, surge: int, unavailable: int
) -> None:
    cluster = serving(desired, surge=surge, unavailable=unavailable, gpus=desired + surge)
    cluster.roll("new")
    assert max(cluster.requested) <= desired + surge
    assert min(cluster.serving) >= desired - unavailable


def test_on_exactly_desired_gpus_one_replica_is_unavailable_at_a_time() -> None:
    cluster = serving(4, surge=0, unavailable=1, gpus=4)
    cluster.roll("new")
    assert max(cluster.requested) == 4 and min(cluster.serving) == 3


def test_a_new_revision_that_never_becomes_ready_keeps_the_old_one_serving() -> None:
    for surge, unavailable in ((0, 1), (1, 0)):
        cluster = serving(3, surge=surge, unavailable=unavailable, gpus=3 + surge, broken={"new"})
        for _ in range(30):
            cluster.tick("new")
        assert cluster.ready["old"] == 3 - unavailable, (surge, unavailable)
        assert cluster.spec["new"] == max(1, surge) and cluster.ready["new"] == 0
        assert max(cluster.requested) <= 3 + surge


def test_a_fixed_revision_replaces_a_broken_one_mid_rollout() -> None:
    cluster = serving(3, surge=1, unavailable=0, gpus=4, broken={"bad"})
    for _ in range(5):
        cluster.tick("bad")
    cluster.roll("good")
    assert max(cluster.requested) <= 4 and min(cluster.serving) >= 3
    assert set(cluster.spec) == {"good"}


def test_a_not_ready_old_replica_goes_even_at_the_availability_floor() -> None:
    # 2 of 3 Ready = desired - maxUnavailable: no Ready replica may go, the crash-looping one may.
    old = RevisionReplicas("old", 3, 2)
    assert next_replicas(3, 0, 1, RevisionReplicas("new", 0, 0), [old]) == {"new": 0, "old": 2}
    old = RevisionReplicas("old", 2, 2)
    assert next_replicas(3, 0, 1, RevisionReplicas("new", 0, 0), [old]) == {"new": 1, "old": 2}


def test_without_an_old_revision_the_count_is_just_desired() -> None:
    assert next_replicas(4, 0, 1, RevisionReplicas("rev", 2, 2), []) == {"rev": 4}
    assert next_replicas(1, 0, 1, RevisionReplicas("rev", 3, 3), []) == {"rev": 1}
    assert next_replicas(0, 1, 0, RevisionReplicas("new", 1, 1), [RevisionReplicas("old", 2, 2)]) == {
        "new": 0,
        "old": 0,
    }


def test_the_desired_count_changing_mid_rollout_is_followed() -> None:
    cluster = serving(3, surge=1, unavailable=0, gpus=10)
    cluster.tick("new")
    cluster.tick("new")
    cluster.desired = 5
    cluster.roll("new")
    assert cluster.spec == {"new": 5}
    cluster.desired = 2
    cluster.roll("newer")
    assert max(cluster.requested[-10:]) <= 5 + 1


def test_an_unset_max_unavailable_follows_the_surge() -> None:
    assert unavailable_allowed(1, None) == 0
    assert unavailable_allowed(0, None) == 1
    assert unavailable_allowed(0, 2) == 2


def test_no_surge_and_no_unavailability_is_refused() -> None:
    with pytest.raises(ValueError, match="must not both be 0"):
        next_replicas(3, 0, 0, RevisionReplicas("new", 0, 0), [RevisionReplicas("old", 3, 3)])
