"""How many retries the router may spend: a share of the requests it received over a sliding window.

A retry hides a failed attempt from the client, but it is also extra load: retrying every failure of an
overloaded or broken service multiplies its traffic exactly when it can least take it. So retries come from
a budget, as in Finagle's RetryBudget and Envoy's retry budgets: over the last `window_s` seconds, at most
`ratio` x the requests received, plus a small floor so a quiet service can still retry its occasional
failure. A canary that fails more than the budget covers is then visible to clients as well as to the
analysis — which counts every attempt, retried or not.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class RetryBudget:
    ratio: float = 0.1
    floor: int = 3  # retries allowed per window whatever the request count
    window_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _requests: collections.deque[float] = field(default_factory=collections.deque)
    _retries: collections.deque[float] = field(default_factory=collections.deque)

    def __post_init__(self) -> None:
        if not 0 <= self.ratio <= 1:
            raise ValueError(f"retry budget ratio must be within 0..1, got {self.ratio}")
        if self.floor < 0 or self.window_s <= 0:
            raise ValueError("retry budget floor must be >= 0 and its window > 0")

    def _expire(self, now: float) -> None:
        for times in (self._requests, self._retries):
            while times and times[0] <= now - self.window_s:
                times.popleft()

    def request(self) -> None:
        """A request arrived (its first attempt is free)."""
        now = self.clock()
        self._expire(now)
        self._requests.append(now)

    def allowed(self) -> int:
        self._expire(self.clock())
        return self.floor + int(self.ratio * len(self._requests))

    def try_spend(self) -> bool:
        """Take one retry from the budget; False (and nothing taken) when it is spent."""
        now = self.clock()
        if len(self._retries) >= self.allowed():
            return False
        self._retries.append(now)
        return True
