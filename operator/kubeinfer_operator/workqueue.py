"""Which InferenceServices need a reconcile, as client-go's workqueue does it: a key waiting is
queued once however many events name it, one key is never reconciled twice at once, a key that
changes while being reconciled is reconciled again after, and a failure is retried with backoff."""

from __future__ import annotations

import asyncio
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
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._waiting: set[Key] = set()
        self._active: set[Key] = set()
        self._dirty: set[Key] = set()
        self._failures: dict[Key, int] = {}

    def add(self, key: Key) -> None:
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._waiting:
            self._waiting.add(key)
            self._queue.put_nowait(key)

    def retry_delay(self, failures: int) -> float:
        return min(self._max_delay, self._base_delay * 2 ** (failures - 1))

    async def _handle(self, key: Key) -> None:
        self._waiting.discard(key)
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
            key = await self._queue.get()
            await self._handle(key)
