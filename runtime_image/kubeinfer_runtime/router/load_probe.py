"""Reads each replica's load from its /metrics, about once a second, for the least-load pick."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kubeinfer_runtime.router.balancer import BackendLoad

log = logging.getLogger(__name__)

# Our engine's names first, then vLLM's (kv_cache_usage_perc is 0..1 despite its name; gpu_cache_usage_perc
# is the pre-v1 spelling).
WAITING_METRICS = ("kubeinfer_requests_waiting", "vllm:num_requests_waiting")
KV_USAGE_METRICS = ("kubeinfer_kv_cache_usage_ratio", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def parse_load(text: str) -> BackendLoad:
    """Waiting requests summed over models and KV-cache usage (the fullest cache) from Prometheus text."""
    waiting: list[float] = []
    kv_usage: list[float] = []
    for family in text_string_to_metric_families(text):
        if family.name in WAITING_METRICS:
            waiting += [s.value for s in family.samples]
        elif family.name in KV_USAGE_METRICS:
            kv_usage += [s.value for s in family.samples]
    return BackendLoad(waiting=sum(waiting), kv_cache_usage=max(kv_usage, default=0.0))


class LoadProbe:
    """The latest load of every configured endpoint; endpoints no longer configured are forgotten."""

    def __init__(self, client: httpx.AsyncClient, interval_s: float = 1.0) -> None:
        self.client = client
        self.interval_s = interval_s
        self.loads: dict[str, BackendLoad] = {}

    async def probe(self, endpoint: str) -> BackendLoad:
        try:
            response = await self.client.get(f"{endpoint}/metrics", timeout=self.interval_s)
            response.raise_for_status()
            return parse_load(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            log.debug("load probe of %s failed: %s", endpoint, exc)
            return BackendLoad(reachable=False)

    async def probe_all(self, endpoints: Iterable[str]) -> None:
        targets = sorted(endpoints)
        results = await asyncio.gather(*(self.probe(e) for e in targets))
        self.loads = dict(zip(targets, results, strict=True))

    async def run(self, endpoints: Callable[[], Iterable[str]]) -> None:
        while True:
            await self.probe_all(endpoints())
            await asyncio.sleep(self.interval_s)
