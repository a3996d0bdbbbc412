"""Which InferenceServices need a reconcile, as client-go's workqueue does it: a key waiting is
queued once however many events name it, one key is never reconciled twice at once, a key that
changes while being reconciled is reconciled again after, and a failure is retried with backoff.

Two priorities: what an event asks for goes before what a resync pass asks for, so a user's change
to one service is not queued behind a periodic pass over a thousand unchanged ones."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable

Key = tuple[str, str]  # (namespace, name)
log = logging.getLogger(__name__)


class WorkQueue:
    def __init__(
        self,
        process: Callable[[Key], Awaitable[None]],
        *,
        base_delay: float = 0.5,
        max_delay: float = 60.0,
    ) -> None:
        self._process = process
        self._base_delay = base_delay
        self._max_delay = max_delay
        # (priority, arrival, key): 0 for events, 1 for resync passes; FIFO within a priority.
        self._queue: asyncio.PriorityQueue[tuple[int, int, Key]] = asyncio.PriorityQueue()
        self._arrivals = itertools.count()
        self._waiting: dict[Key, int] = {}  # queued keys and the best priority each is queued at
        self._active: set[Key] = set()
        self._dirty: set[Key] = set()
        self._failures: dict[Key, int] = {}

    def add(self, key: Key, background: bool = False) -> None:
        priority = 1 if background else 0
        if key in self._active:
            self._dirty.add(key)
        elif self._waiting.get(key, 2) > priority:  # not queued yet, or only behind the resync pass
            self._waiting[key] = priority
            self._queue.put_nowait((priority, next(self._arrivals), key))

    def retry_delay(self, failures: int) -> float:
        return min(self._max_delay, self._base_delay * 2 ** (failures - 1))

    async def _handle(self, key: Key) -> None:
        self._waiting.pop(key, None)
        self._active.add(key)
        try:
            await self._process(key)
            self._failures.pop(key, None)
        except Exception:
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            delay = self.retry_delay(failures)
            log.exception("reconcile of %s/%s failed (attempt %d); retrying in %.1fs", *key, failures, delay)
            asyncio.get_running_loop().call_later(delay, self.add, key)
        finally:
            self._active.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self.add(key)

    async def worker(self) -> None:
        while True:
            priority, _, key = await self._queue.get()
            if self._waiting.get(key) == priority:  # else: an entry superseded by an urgent one
                await self._handle(key)
