"""The router's HTTP app: an OpenAI-compatible pass-through proxy in front of an InferenceService's tracks.

A request is given a track by weight, then the least-loaded replica in it. If connecting fails, or the
replica answers 5xx/429, or the connection drops before the first body byte, the request may be retried
once on another replica (same track first) — nothing has reached the client yet, so the retry is
invisible. Retries come from a budget (retry_budget.py): a share of recent requests, so a failing
replica's load is not multiplied onto the others. A 429 (the replica's queue is full) is retried only on
another replica of the same track: the load probe's view is a second old, so a sibling may have room, but
an overloaded stable track must not spill its overflow onto a canary sized for its weight. When no retry is
left the client gets that one 429, with a Retry-After (the replica's, or the router's 1 s). Once the first
byte is forwarded the response is committed: chunks are passed through as they arrive.

Connections to the replicas are capped (upstream_limits.py); a request that finds the cap reached for
longer than the pool timeout gets a 503 with Retry-After, counted under no replica's track: it is the
router's own limit, not the replica's failure. Body size and read timeouts are kubeinfer_runtime.http_edge's;
API keys (checked here and again by the replica, to which the Authorization header is forwarded)
kubeinfer_runtime.api_keys'.

Every attempt is counted under the track of the replica it went to (`kubeinfer_router_upstream_attempts`),
whether or not a retry then hid it from the client: the canary analysis judges a track on what its
replicas did, not on what the client finally got.

If the client goes away at any point, the backend request is closed so the replica stops generating.
If the backend cuts a stream, the client connection is dropped rather than ended cleanly, so the client
can tell the body is truncated.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from kubeinfer_runtime.api_keys import ApiKeys, RequireApiKey
from kubeinfer_runtime.http_edge import BodyLimit, EdgeLimits
from kubeinfer_runtime.router.balancer import TrackChooser, pick_least_loaded
from kubeinfer_runtime.router.config import ConfigFile, RouterConfig
from kubeinfer_runtime.router.configmap_source import ConfigMapSource
from kubeinfer_runtime.router.load_probe import LoadProbe
from kubeinfer_runtime.router.metrics import RouterMetrics
from kubeinfer_runtime.router.retry_budget import RetryBudget
from kubeinfer_runtime.router.upstream_limits import (
    RETRY_AFTER_S,
    UpstreamLimits,
    UpstreamPoolFull,
    probe_client,
    upstream_client,
    with_retry_after,
)
from kubeinfer_runtime.tracing.router_spans import AttemptSpan, NoRouterTracing, RouterTracing

log = logging.getLogger(__name__)

# Headers that describe one connection, not the message; uvicorn writes its own date and server.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade", "host", "date", "server"}
)  # fmt: skip
REQUEST_ID = "x-request-id"
TRACK_HEADER = "x-kubeinfer-track"
# Says which component answered /ready and /health: the operator's probe through the Service URL tells
# from it whether a change of serving path (router <-> replicas) has reached the cluster's proxies.
COMPONENT_HEADER = "x-kubeinfer-component"
TRANSPORT = "transport"  # attempt outcome: no HTTP answer (refused, reset, cut mid-stream)

AttemptOrder = list[tuple[str, tuple[str, ...]]]  # (track, its endpoints), in the order to try them


def is_retryable(status: int) -> bool:
    return status >= 500 or status == 429


def error_response(status: int, message: str, request_id: str, track: str | None = None) -> JSONResponse:
    headers = {REQUEST_ID: request_id} | ({TRACK_HEADER: track} if track else {})
    body = {"error": {"message": message, "type": "router_error", "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


@dataclass
class Upstream:
    """A backend response whose first body chunk has arrived: from here on the request is committed."""

    track: str
    endpoint: str
    response: httpx.Response
    first_chunk: bytes
    rest: AsyncIterator[bytes]
    started: float  # when this attempt was sent: its latency is the replica's, not the earlier attempts'
    span: AttemptSpan  # ended once the response is relayed

    @property
    def streamed(self) -> bool:
        return self.response.headers.get("content-type", "").startswith("text/event-stream")


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class Router:
    """The /v1/* ASGI endpoint, plus /health, /ready and /metrics."""

    def __init__(
        self,
        config: ConfigFile | ConfigMapSource,
        client: httpx.AsyncClient,
        probe: LoadProbe,
        max_attempts: int,
        budget: RetryBudget | None = None,
        upstream_limits: UpstreamLimits | None = None,
        tracing: RouterTracing | None = None,
    ) -> None:
        self.config = config
        self.client = client
        self.upstream_limits = upstream_limits or UpstreamLimits()
        self.probe = probe
        self.max_attempts = max_attempts
        self.budget = budget or RetryBudget()
        self.tracing = tracing or NoRouterTracing()
        self.metrics = RouterMetrics()
        self.chooser = TrackChooser()
        self.in_flight: collections.Counter[str] = collections.Counter()
        self._turns: collections.Counter[str] = collections.Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        received_at = time.perf_counter()
        body = await request.body()
        serve = asyncio.create_task(self._serve(request, body, received_at, send))
        client_gone = asyncio.create_task(_wait_for_disconnect(receive))
        try:
            await asyncio.wait({serve, client_gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            client_gone.cancel()
            serve.cancel()  # a no-op once it finished; otherwise the client left and the work stops
            with contextlib.suppress(asyncio.CancelledError):
                await serve

    async def _serve(self, request: Request, body: bytes, received_at: float, send: Send) -> None:
        request_id = request.headers.get(REQUEST_ID) or uuid.uuid4().hex
        self.budget.request()
        config = self.config.current
        track = self.chooser.choose(config.routable_weights())
        if track is None:
            self.metrics.requests.labels(track="none", code="503").inc()
            response = error_response(503, "no replica is ready to serve this model", request_id)
            return await response(request.scope, request.receive, send)
        headers = [
            (k, v) for k, v in request.headers.items() if k not in HOP_BY_HOP | {"content-length", REQUEST_ID}
        ]
        headers.append((REQUEST_ID, request_id))
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        try:
            upstream, failures = await self._connect(
                request.method, path, headers, body, self.attempt_order(config, track)
            )
        except asyncio.CancelledError:
            self._record(track, "499", received_at)
            raise
        except UpstreamPoolFull as full:
            self._record(track, "503", received_at)
            response = error_response(503, str(full), request_id, track)
            response.headers["retry-after"] = str(RETRY_AFTER_S)
            return await response(request.scope, request.receive, send)
        if upstream is None:
            log.warning("request %s failed on every replica tried: %s", request_id, "; ".join(failures))
            self._record(track, "502", received_at)
            response = error_response(502, f"no replica answered: {'; '.join(failures)}", request_id, track)
            return await response(request.scope, request.receive, send)
        await self._relay(upstream, request_id, send)

    @staticmethod
    def attempt_order(config: RouterConfig, track: str) -> AttemptOrder:
        """The chosen track, then the other routable tracks by descending weight, for retries."""
        weights = config.routable_weights()
        others = sorted((t for t in weights if t != track), key=lambda t: -weights[t])
        return [(t, config.tracks[t].endpoints) for t in (track, *others)]

    def next_endpoint(self, order: AttemptOrder, tried: set[str], rotation: int) -> tuple[str, str] | None:
        for track, endpoints in order:
            endpoint = pick_least_loaded(endpoints, self.probe.loads, self.in_flight, tried, rotation)
            if endpoint is not None:
                return track, endpoint
        return None

    def _may_retry(
        self, order: AttemptOrder, tried: set[str], rotation: int, track: str, reason: str
    ) -> bool:
        """Whether a failed attempt on `track` is tried again elsewhere: another replica is left, the
        request has attempts left, and the retry budget has one to spend."""
        if len(tried) >= self.max_attempts or self.next_endpoint(order, tried, rotation) is None:
            return False
        if not self.budget.try_spend():
            self.metrics.retries_denied.labels(track=track).inc()
            return False
        self.metrics.retries.labels(track=track, reason=reason).inc()
        return True

    async def _connect(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes, order: AttemptOrder
    ) -> tuple[Upstream | None, list[str]]:
        """Try replicas until one sends a first body chunk; (None, failures) when none did."""
        tried: set[str] = set()
        failures: list[str] = []
        # Equally loaded replicas of a track take turns: one turn per request the track is chosen for.
        rotation = self._turns[order[0][0]]
        self._turns[order[0][0]] += 1
        while picked := self.next_endpoint(order, tried, rotation):
            track, endpoint = picked
            tried.add(endpoint)
            self.in_flight[endpoint] += 1
            started = time.perf_counter()
            span = self.tracing.attempt(
                track, endpoint, len(tried), self.probe.loads.get(endpoint), self.in_flight[endpoint]
            )
            response: httpx.Response | None = None
            committed = False
            try:
                request = self.client.build_request(
                    method, endpoint + path, headers=span.headers(headers), content=body
                )
                response = await self.client.send(request, stream=True)
                status = response.status_code
                span.answered(status)
                if status == 429:  # retried within its track only (see the module's docstring)
                    order = [(t, endpoints) for t, endpoints in order if t == track]
                if is_retryable(status) and self._may_retry(order, tried, rotation, track, str(status)):
                    self.metrics.attempts.labels(track=track, code=str(status)).inc()
                    failures.append(f"{endpoint}: HTTP {status}")
                    continue
                rest = response.aiter_raw()
                first_chunk = await anext(rest, b"")
                committed = True
                return Upstream(track, endpoint, response, first_chunk, rest, started, span), failures
            except httpx.PoolTimeout as exc:  # a TransportError, but ours: no replica was tried
                span.failed(exc)
                raise UpstreamPoolFull(self.upstream_limits) from exc
            except httpx.TransportError as exc:
                span.failed(exc)
                self.metrics.attempts.labels(track=track, code=TRANSPORT).inc()
                failures.append(f"{endpoint}: {exc!r}")
                if not self._may_retry(order, tried, rotation, track, TRANSPORT):
                    break
            finally:
                if not committed:
                    span.end()
                    if response is not None:
                        await response.aclose()
                    self._release(endpoint)
        return None, failures

    async def _relay(self, upstream: Upstream, request_id: str, send: Send) -> None:
        response = upstream.response
        headers = [
            (k, v) for k, v in response.headers.raw if k.lower().decode() not in HOP_BY_HOP | {REQUEST_ID}
        ]
        headers += [
            (REQUEST_ID.encode(), request_id.encode()),
            (TRACK_HEADER.encode(), upstream.track.encode()),
        ]
        if response.status_code == 429:
            headers = with_retry_after(headers)
        code, attempt, ttft, gaps = str(response.status_code), str(response.status_code), None, []
        try:
            await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
            last = time.perf_counter()
            if upstream.first_chunk:
                await send({"type": "http.response.body", "body": upstream.first_chunk, "more_body": True})
                ttft = last - upstream.started
            async for chunk in upstream.rest:
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.TransportError as exc:
            code, attempt = "502", TRANSPORT
            log.warning("request %s: %s cut the stream: %r", request_id, upstream.endpoint, exc)
        except OSError:  # the client's connection broke under a send
            code = attempt = "499"
        except asyncio.CancelledError:  # the client went away while we waited on the backend
            code = attempt = "499"
            raise
        finally:
            await response.aclose()
            self._release(upstream.endpoint)
            upstream.span.end(attempt)
            self.metrics.attempts.labels(track=upstream.track, code=attempt).inc()
            if upstream.streamed:
                self._record(upstream.track, code, upstream.started, ttft, gaps)
            else:
                self._record(upstream.track, code, upstream.started)

    def _record(
        self, track: str, code: str, since: float, ttft: float | None = None, gaps: Sequence[float] = ()
    ) -> None:
        """The outcome the client saw; latency from `since`, the start of the committed attempt."""
        self.metrics.requests.labels(track=track, code=code).inc()
        self.metrics.e2e.labels(track=track).observe(time.perf_counter() - since)
        if ttft is not None:
            self.metrics.ttft.labels(track=track).observe(ttft)
        itl = self.metrics.itl.labels(track=track)
        for gap in gaps:
            itl.observe(gap)

    def _release(self, endpoint: str) -> None:
        self.in_flight[endpoint] -= 1
        if self.in_flight[endpoint] <= 0:
            del self.in_flight[endpoint]  # pods come and go; keep no entry per pod IP ever seen

    async def ready(self, request: Request) -> Response:
        headers = {COMPONENT_HEADER: "router"}
        if self.config.current.routable_weights():
            return PlainTextResponse("ready", headers=headers)
        return PlainTextResponse("no track has endpoints", status_code=503, headers=headers)

    async def health(self, request: Request) -> Response:
        return PlainTextResponse("ok", headers={COMPONENT_HEADER: "router"})

    async def metrics_page(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def watch_config(self, poll_s: float) -> None:
        while True:
            await asyncio.sleep(poll_s)
            await asyncio.to_thread(self.config.reload_if_changed)


def create_app(
    config_source: Path | ConfigMapSource,
    *,
    probe_interval_s: float = 1.0,
    config_poll_s: float = 1.0,
    max_attempts: int = 2,
    connect_timeout_s: float = 2.0,
    retry_budget: RetryBudget | None = None,
    upstream_limits: UpstreamLimits | None = None,
    edge_limits: EdgeLimits | None = None,
    api_keys: ApiKeys | None = None,
    tracing: RouterTracing | None = None,
) -> Starlette:
    """The router app; raises ConfigError when the configuration file is missing or malformed."""
    config = ConfigFile(config_source) if isinstance(config_source, Path) else config_source
    upstream_limits = upstream_limits or UpstreamLimits()
    client = upstream_client(upstream_limits, connect_timeout_s)
    probe_http = probe_client()  # its own pool: a full upstream pool must not blind the load probe
    probe = LoadProbe(probe_http, probe_interval_s)
    router = Router(config, client, probe, max_attempts, retry_budget, upstream_limits, tracing)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks = [
            asyncio.create_task(router.watch_config(config_poll_s)),
            asyncio.create_task(probe.run(lambda: router.config.current.all_endpoints())),
        ]
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.aclose()
        await probe_http.aclose()

    routes = [
        Route("/health", router.health),
        Route("/ready", router.ready),
        Route("/metrics", router.metrics_page),
        # An ASGI endpoint: it streams. Unwrapped when tracing is off.
        Route("/v1/{path:path}", router.tracing.wrap(router), methods=["GET", "POST"]),
    ]
    # The key first (a refused client sends no body the router reads); it is forwarded to the replicas.
    middleware = [
        Middleware(RequireApiKey, keys=api_keys),
        Middleware(BodyLimit, limits=edge_limits or EdgeLimits()),
    ]
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
