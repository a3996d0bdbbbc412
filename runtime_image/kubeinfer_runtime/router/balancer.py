"""Where a request goes: which track (by weight), then which replica in it (by load). No I/O here."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass


class TrackChooser:
    """Smooth weighted round robin (nginx's scheme) over tracks.

    Deterministic and exact: over any run of sum(weights) consecutive choices each track is chosen exactly
    weight times, and the choices are spread out (90/10 sends every tenth request to the canary, not ten
    in a row). Random choice would only match the weight on average, which with the few requests a GPU
    service sees per analysis window is not good enough. The state restarts whenever the weights change.
    """

    def __init__(self) -> None:
        self._weights: dict[str, int] = {}
        self._current: dict[str, int] = {}

    def choose(self, weights: Mapping[str, int]) -> str | None:
        """Pick a track among those with weight > 0; None when there is none."""
        live = {name: w for name, w in weights.items() if w > 0}
        if not live:
            return None
        if live != self._weights:
            self._weights = live
            self._current = dict.fromkeys(live, 0)
        total = sum(live.values())
        for name, weight in live.items():
            self._current[name] += weight
        best = max(self._current, key=self._current.__getitem__)
        self._current[best] -= total
        return best


@dataclass(frozen=True)
class BackendLoad:
    """What a replica's /metrics said at the last probe."""

    waiting: float = 0.0
    kv_cache_usage: float = 0.0
    reachable: bool = True


UNKNOWN_LOAD = BackendLoad()


def pick_least_loaded(
    endpoints: Sequence[str],
    loads: Mapping[str, BackendLoad],
    in_flight: Mapping[str, int],
    exclude: Collection[str] = (),
    rotation: int = 0,
) -> str | None:
    """The replica with the fewest waiting requests, then the lowest KV-cache usage.

    Probes are up to a second old, so the router's own in-flight requests to each replica are added to
    its waiting count: a burst arriving between two probes spreads out instead of piling onto the replica
    that looked idle. Replicas whose last probe failed go last (they may be gone; the retry path covers
    them), and ties rotate with `rotation` so equal replicas share the traffic.
    """
    candidates = [e for e in endpoints if e not in exclude]
    if not candidates:
        return None
    n = len(candidates)

    def key(indexed: tuple[int, str]) -> tuple[bool, float, float, int]:
        i, endpoint = indexed
        load = loads.get(endpoint, UNKNOWN_LOAD)
        return (
            not load.reachable,
            load.waiting + in_flight.get(endpoint, 0),
            load.kv_cache_usage,
            (i - rotation) % n,
        )

    return min(enumerate(candidates), key=key)[1]
