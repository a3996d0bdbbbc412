"""Send one streaming request to an OpenAI-compatible server and time every token that comes back."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field

import httpx

from kubeinfer_operator.bench.workload import RequestSpec


@dataclass
class RequestResult:
    """One request as the client saw it. Times are `time.perf_counter()` seconds."""

    start: float
    end: float = 0.0
    error: str | None = None  # the error's kind: http_429, http_500, timeout, connection, stream_error
    error_detail: str = ""
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk that carried text
    prompt_tokens: int | None = None  # from the server's usage, when it reports one
    output_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.start if self.chunk_times else None

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def itls(self) -> list[float]:
        """Gaps between successive text chunks (a chunk may carry more than one token)."""
        return [b - a for a, b in itertools.pairwise(self.chunk_times)]

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first: (e2e - ttft) / (output_tokens - 1)."""
        if self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Target:
    """Where requests go and how they are shaped."""

    base_url: str  # e.g. http://127.0.0.1:8000 (without /v1)
    model: str
    timeout_s: float = 600.0
    ignore_eos: bool = True  # generate exactly max_tokens, so output lengths follow the workload
    api_key: str | None = None
    # OpenAI's response_format, sent with every request to measure structured outputs' cost; the
    # output then ends where the grammar does, ignore_eos or not.
    response_format: dict | None = None


def request_body(target: Target, spec: RequestSpec) -> tuple[str, dict]:
    """(path, JSON body) for a spec: /v1/chat/completions for messages, /v1/completions otherwise."""
    body: dict = {
        "model": target.model,
        "max_tokens": spec.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if target.ignore_eos:
        body["ignore_eos"] = True
    if target.response_format is not None:
        body["response_format"] = target.response_format
    if spec.messages is not None:
        return "/v1/chat/completions", {**body, "messages": spec.messages}
    return "/v1/completions", {**body, "prompt": spec.prompt}


def _chunk_text(choice: dict) -> str:
    if "delta" in choice:
        return choice["delta"].get("content") or ""
    return choice.get("text") or ""


async def send_request(client: httpx.AsyncClient, target: Target, spec: RequestSpec) -> RequestResult:
    path, body = request_body(target, spec)
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    result = RequestResult(start=time.perf_counter())
    done = False
    try:
        async with asyncio.timeout(target.timeout_s):
            async with client.stream("POST", target.base_url + path, json=body, headers=headers) as response:
                if response.status_code >= 400:
                    result.error = f"http_{response.status_code}"
                    result.error_detail = (await response.aread()).decode(errors="replace")[:200]
                    return result
                async for line in response.aiter_lines():
                    now = time.perf_counter()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        result.error, result.error_detail = "stream_error", str(chunk["error"])[:200]
                        return result
                    for choice in chunk.get("choices") or []:
                        if _chunk_text(choice):
                            result.chunk_times.append(now)
                    if usage := chunk.get("usage"):
                        result.prompt_tokens = usage.get("prompt_tokens")
                        result.output_tokens = usage.get("completion_tokens") or 0
    except (TimeoutError, httpx.TimeoutException):
        result.error = "timeout"
    except httpx.TransportError as e:  # refused, reset, or closed mid-stream
        result.error, result.error_detail = "connection", f"{type(e).__name__}: {e}"[:200]
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSON that is not an OpenAI chunk
        result.error, result.error_detail = "stream_error", f"bad SSE data: {type(e).__name__}: {e}"[:200]
    finally:
        result.end = time.perf_counter()
    if result.ok and not done:
        result.error, result.error_detail = "stream_error", "the stream ended without data: [DONE]"
    if result.ok and not result.output_tokens:
        result.output_tokens = len(result.chunk_times)  # the server sent no usage: count chunks instead
    return result


async def discover_model(client: httpx.AsyncClient, base_url: str) -> str:
    """The first model the server lists at /v1/models."""
    response = await client.get(base_url + "/v1/models")
    response.raise_for_status()
    models = response.json().get("data") or []
    if not models:
        raise ValueError(f"{base_url}/v1/models lists no models; pass --model")
    return models[0]["id"]


def make_client(timeout_s: float) -> httpx.AsyncClient:
    # No connection cap: the workload, not the HTTP pool, decides how many requests are in flight.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits)
