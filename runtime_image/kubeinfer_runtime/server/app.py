"""The FastAPI app: probes, /metrics, the OpenAI routes, and the per-request envelope (id, auth, log line)."""

from __future__ import annotations

import logging
import random
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kubeinfer_runtime.api_keys import ApiKeys
from kubeinfer_runtime.http_edge import BodyLimit
from kubeinfer_runtime.server import errors
from kubeinfer_runtime.server.async_engine import AsyncEngine, EngineState, TrackedRequest
from kubeinfer_runtime.server.config import ServerConfig
from kubeinfer_runtime.server.errors import APIError
from kubeinfer_runtime.server.openai_api import router
from kubeinfer_runtime.tracing.runtime_spans import NoRuntimeTracing, RuntimeTracing

log = logging.getLogger("kubeinfer.server")
request_log = logging.getLogger("kubeinfer.request")


@dataclass
class RuntimeState:
    config: ServerConfig
    engine: AsyncEngine
    api_keys: ApiKeys | None = None  # None: no key needed
    draining: bool = False
    http_in_flight: int = 0  # API requests whose response has not been fully sent
    started_at: int = field(default_factory=lambda: int(time.time()))
    fault_rng: random.Random = field(default_factory=random.Random)
    tracing: RuntimeTracing = field(default_factory=NoRuntimeTracing)

    def ready(self) -> bool:
        return self.engine.state == EngineState.READY and not self.draining

    def check_accepting(self, model: str) -> None:
        """Raise the error a new generation request gets now, if any.

        A request that reaches a draining server is served: it came on a connection the client opened
        before the drain (kube-proxy pins a kept-alive connection to its pod) or before the proxies
        dropped this pod. Its response closes the connection (RequestEnvelope), so the next request
        goes to a pod that is not stopping."""
        if self.engine.state != EngineState.READY:
            self.engine.metrics.count_request("rejected")
            raise errors.unavailable(f"The model is not ready (engine {self.engine.state}).")
        if model != self.config.served_model_name:
            raise errors.model_not_found(model, self.config.served_model_name)
        if self.config.fault_error_rate and self.fault_rng.random() < self.config.fault_error_rate:
            self.engine.metrics.count_request("error")
            raise APIError(500, "Injected fault (--fault-error-rate).", code="injected_fault")


class RequestEnvelope:
    """X-Request-Id in and out, the API key check, in-flight counting and one log line per API request.

    Plain ASGI rather than BaseHTTPMiddleware so that the log line is written when a stream ends.
    """

    def __init__(self, app: ASGIApp, runtime: RuntimeState) -> None:
        self.app = app
        self.runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        request.state.request_id = request_id
        request.state.arrival_time = time.monotonic()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
                if self.runtime.draining:  # the client's next request opens a connection elsewhere
                    headers.append((b"connection", b"close"))
                message["headers"] = headers
            await send(message)

        if not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send_with_id)
            return
        self.runtime.http_in_flight += 1
        try:
            if self._authorized(request):
                await self.app(scope, receive, send_with_id)
            else:
                await errors.invalid_api_key().response()(scope, receive, send_with_id)
        finally:
            self.runtime.http_in_flight -= 1
            self._log(request, status)
            self.runtime.tracing.record(request, status)

    def _authorized(self, request: Request) -> bool:
        keys = self.runtime.api_keys
        return keys is None or keys.allows(request.headers.get("authorization"))

    @staticmethod
    def _log(request: Request, status: int) -> None:
        now = time.monotonic()
        arrival = request.state.arrival_time
        tracked: TrackedRequest | None = getattr(request.state, "tracked", None)
        fields = {
            "request_id": request.state.request_id,
            "method": request.method,
            "path": request.url.path,
            "status": status,
            # Unset only when the client left before the engine confirmed the abort.
            "outcome": (tracked.outcome or "cancelled") if tracked else None,
            "queue_time_s": _seconds(tracked.scheduled_time - arrival)
            if tracked and tracked.scheduled_time
            else None,
            "ttft_s": _seconds(tracked.first_token_time - arrival)
            if tracked and tracked.first_token_time
            else None,
            "prompt_tokens": tracked.num_prompt_tokens if tracked else None,
            "cached_tokens": tracked.num_cached_prompt_tokens if tracked else None,
            "completion_tokens": tracked.num_output_tokens if tracked else None,
            "e2e_s": _seconds(now - arrival),
        }
        request_log.info("request", extra={"fields": fields})


def _seconds(value: float) -> float:
    return round(value, 6)


def create_app(runtime: RuntimeState) -> FastAPI:
    app = FastAPI(title="kubeinfer runtime", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runtime = runtime
    app.add_middleware(BodyLimit, limits=runtime.config.edge_limits)  # inside the envelope: after auth
    app.add_middleware(RequestEnvelope, runtime=runtime)
    app.include_router(router)

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", extra={"fields": {"request_id": request.state.request_id}})
        return APIError(500, f"Internal error: {exc}", code="internal_error").response()

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return errors.validation_error(exc.errors()).response()

    @app.get("/health")
    async def health() -> JSONResponse:
        alive = runtime.engine.alive()
        return JSONResponse(
            {"status": "ok" if alive else "failed", "engine": runtime.engine.state}, 200 if alive else 503
        )

    @app.get("/ready")
    async def ready() -> JSONResponse:
        body = {"ready": runtime.ready(), "engine": runtime.engine.state, "draining": runtime.draining}
        # Which component answered: the operator's probe through the Service URL reads it (the router
        # answers "router"), to know a change of serving path has reached the cluster's proxies.
        headers = {"x-kubeinfer-component": "runtime"}
        return JSONResponse(body, 200 if runtime.ready() else 503, headers=headers)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(runtime.engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
