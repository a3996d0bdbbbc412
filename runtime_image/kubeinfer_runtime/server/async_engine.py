"""Bridges the single-threaded LLMEngine to asyncio.

Only the engine thread touches the engine: it loads the model, warms it up, then loops over
(apply queued add/abort commands, abort requests past the queue timeout, step). Each step's outputs
and a stats snapshot go back to the event loop in one ``call_soon_threadsafe`` callback, which
updates the metrics and feeds each request's asyncio queue. Admission is decided on the event loop,
where the set of requests in flight lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from kubeinfer_runtime.engine.types import FinishReason, RequestOutput, SamplingParams
from kubeinfer_runtime.server import errors
from kubeinfer_runtime.server.errors import APIError
from kubeinfer_runtime.server.metrics import RuntimeMetrics, StatsSnapshot

if TYPE_CHECKING:
    from kubeinfer_runtime.engine.llm_engine import LLMEngine
    from kubeinfer_runtime.tokenizer import Tokenizer

log = logging.getLogger("kubeinfer.engine")


class EngineState(StrEnum):
    LOADING = "loading"  # loading weights or warming up
    READY = "ready"
    FAILED = "failed"  # load, warm-up or a step raised; the engine thread has ended
    STOPPED = "stopped"


@dataclass(frozen=True)
class AdmissionLimits:
    max_running: int  # the engine's max_num_seqs
    max_waiting: int  # requests admitted but not yet scheduled
    queue_timeout_s: float  # 0: wait forever


def admits(in_flight: int, limits: AdmissionLimits) -> bool:
    """Whether one more request fits: running slots absorb the first `max_running`, the queue the rest."""
    return in_flight < limits.max_running + limits.max_waiting


def retry_after_s(in_flight: int, max_running: int, mean_e2e_s: float) -> int:
    """Seconds until a slot is likely free: the queue ahead drains `max_running` requests per mean E2E."""
    queued = max(0, in_flight - max_running) + 1
    return min(60, max(1, math.ceil(mean_e2e_s * queued / max_running)))


@dataclass
class TrackedRequest:
    """A request in flight, as the event loop sees it (metrics, usage, the client's output queue)."""

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    num_sequences: int = 1  # the request's n
    outputs: asyncio.Queue[RequestOutput | APIError] = field(default_factory=asyncio.Queue)
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_cached_prompt_tokens: int = 0
    num_output_tokens: int = 0  # of all its sequences
    finish_reasons: list[str] = field(default_factory=list)  # one per finished sequence, for traces
    abort_outcome: str = "cancelled"  # what a FinishReason.ABORT counts as
    outcome: str | None = None  # set once finished

    async def next(self) -> RequestOutput:
        item = await self.outputs.get()
        if isinstance(item, APIError):
            raise item
        return item


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    arrival_time: float


@dataclass(frozen=True)
class _Abort:
    request_id: str


_STOP = object()


def _warm_up(engine: LLMEngine) -> None:
    """One short greedy generation through the whole path (prefill, decode, sampling, detokenize)."""
    prompt = engine.tokenizer.encode("Hello") or [engine.tokenizer.eos_token_id]
    engine.add_request("warm-up", prompt, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()


class AsyncEngine:
    def __init__(
        self,
        load: Callable[[], LLMEngine],
        limits: AdmissionLimits,
        model_name: str,
        *,
        warm_up: bool = True,
        fault_token_latency_s: float = 0.0,
    ) -> None:
        self.limits = limits
        self.state = EngineState.LOADING
        self.snapshot: StatsSnapshot | None = None
        self.metrics = RuntimeMetrics(model_name, lambda: self.snapshot)
        self.tokenizer: Tokenizer | None = None
        self.max_model_len = 0
        self._load = load
        self._warm_up = warm_up
        self._fault_token_latency_s = fault_token_latency_s
        self._requests: dict[str, TrackedRequest] = {}
        self._commands: queue.SimpleQueue[_Add | _Abort | object] = queue.SimpleQueue()
        self._mean_e2e_s = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.done: asyncio.Future[None] | None = None

    # ---- event loop side -------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.done = self._loop.create_future()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the engine thread to finish and wait for it: a thread still inside torch while the
        interpreter shuts down makes the C++ runtime abort the process (SIGABRT, "terminate called
        without an active exception") instead of exiting 0."""
        self._commands.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.state != EngineState.FAILED

    @property
    def in_flight(self) -> int:
        return len(self._requests)

    def submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int,
        arrival_time: float,
    ) -> TrackedRequest:
        """Admit a request or raise 429 with Retry-After; outputs then arrive via `TrackedRequest.next()`."""
        if not admits(self.in_flight, self.limits):
            self.metrics.count_request("rejected")
            raise errors.queue_full(retry_after_s(self.in_flight, self.limits.max_running, self._mean_e2e_s))
        tracked = TrackedRequest(request_id, arrival_time, len(prompt_token_ids), params.n)
        self._requests[request_id] = tracked
        self._commands.put(_Add(request_id, prompt_token_ids, params, priority, arrival_time))
        return tracked

    def abort(self, request_id: str) -> None:
        """Stop a request (counted cancelled), freeing its KV blocks at the next step; no-op once finished."""
        if request_id in self._requests:
            self._commands.put(_Abort(request_id))

    def abort_all(self) -> None:
        for request_id in list(self._requests):
            self.abort(request_id)

    def _post(self, callback: Callable[..., None], *args: object) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop has closed: the process is exiting
            self._loop.call_soon_threadsafe(callback, *args)

    def _on_loaded(self, tokenizer: Tokenizer, max_model_len: int, snapshot: StatsSnapshot) -> None:
        self.tokenizer, self.max_model_len, self.snapshot = tokenizer, max_model_len, snapshot
        self.metrics.engine_stats.baseline = snapshot.stats
        self.state = EngineState.READY
        log.info("engine ready", extra={"fields": {"max_model_len": max_model_len}})

    def _on_ended(self, exc: BaseException | None) -> None:
        assert self.done is not None
        self.state = EngineState.STOPPED if exc is None else EngineState.FAILED
        for tracked in self._requests.values():
            tracked.outcome = "error"
            self.metrics.count_request("error")
            tracked.outputs.put_nowait(APIError(500, f"the engine failed: {exc}", code="engine_error"))
        self._requests.clear()
        if exc is None:
            self.done.set_result(None)
        else:
            self.done.set_exception(exc)

    def _on_rejected(self, request_id: str, message: str) -> None:
        tracked = self._requests.pop(request_id, None)
        if tracked is not None:
            tracked.outputs.put_nowait(APIError(400, message, code="invalid_request"))

    def _on_timed_out(self, request_id: str) -> None:
        tracked = self._requests.get(request_id)
        if tracked is not None:
            tracked.abort_outcome = "timeout"

    def _on_step(self, outputs: list[RequestOutput], snapshot: StatsSnapshot) -> None:
        self.snapshot = snapshot
        now = time.monotonic()
        for out in outputs:
            tracked = self._requests.get(out.request_id)
            if tracked is None:
                continue
            self._account(tracked, out, now)
            if not out.request_finished:
                tracked.outputs.put_nowait(out)
                continue
            del self._requests[out.request_id]
            if tracked.outcome == "timeout":
                tracked.outputs.put_nowait(errors.queue_timeout(self.limits.queue_timeout_s))
            else:
                tracked.outputs.put_nowait(out)

    def _account(self, tracked: TrackedRequest, out: RequestOutput, now: float) -> None:
        """Metrics for one output, observed as it happens (queue time when first scheduled).

        Timings follow the request's first sequence, which prefills the prompt (the others of an
        n > 1 request start from its cached blocks); token counts cover them all.
        """
        m = self.metrics
        if out.index == 0:
            if tracked.scheduled_time is None and out.first_scheduled_time is not None:
                tracked.scheduled_time = out.first_scheduled_time
                m.queue_time.observe(out.first_scheduled_time - tracked.arrival_time)
            for token_time in out.token_times:
                if tracked.first_token_time is None:
                    tracked.first_token_time = token_time
                    m.ttft.observe(token_time - tracked.arrival_time)
                    m.prompt_tokens.inc(out.num_prompt_tokens)
                elif tracked.last_token_time is not None:
                    m.itl.observe(token_time - tracked.last_token_time)
                tracked.last_token_time = token_time
            tracked.num_cached_prompt_tokens = out.num_cached_prompt_tokens
        m.generation_tokens.inc(len(out.new_token_ids))
        tracked.num_output_tokens += len(out.new_token_ids)
        if out.finished and out.finish_reason is not None:
            tracked.finish_reasons.append(out.finish_reason.value)
        if not out.request_finished:
            return
        tracked.outcome = "success" if out.finish_reason != FinishReason.ABORT else tracked.abort_outcome
        m.count_request(tracked.outcome)
        if tracked.outcome != "success":
            return
        e2e = now - tracked.arrival_time
        m.e2e.observe(e2e)
        self._mean_e2e_s = e2e if self._mean_e2e_s == 0 else 0.9 * self._mean_e2e_s + 0.1 * e2e
        per_sequence = tracked.num_output_tokens / tracked.num_sequences
        if tracked.first_token_time is not None and per_sequence > 1:
            ttft = tracked.first_token_time - tracked.arrival_time
            m.tpot.observe((e2e - ttft) / (per_sequence - 1))

    # ---- engine thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            engine = self._load()
            if self._warm_up:
                _warm_up(engine)
            self._post(self._on_loaded, engine.tokenizer, engine.max_model_len, self._stats(engine))
            self._serve(engine)
        except BaseException as exc:
            log.exception("engine thread failed")
            self._post(self._on_ended, exc)
            return
        self._post(self._on_ended, None)

    @staticmethod
    def _stats(engine: LLMEngine) -> StatsSnapshot:
        return StatsSnapshot(engine.stats(), time.monotonic())

    def _serve(self, engine: LLMEngine) -> None:
        unscheduled: dict[str, float] = {}  # request id -> arrival time, for the queue timeout
        while True:
            for command in self._take_commands(block=not engine.has_unfinished_requests()):
                if command is _STOP:
                    return
                if isinstance(command, _Abort):
                    unscheduled.pop(command.request_id, None)
                    engine.abort_request(command.request_id)
                elif isinstance(command, _Add):
                    try:
                        engine.add_request(
                            command.request_id,
                            command.prompt_token_ids,
                            command.params,
                            priority=command.priority,
                            arrival_time=command.arrival_time,
                        )
                    except ValueError as exc:
                        self._post(self._on_rejected, command.request_id, str(exc))
                        continue
                    unscheduled[command.request_id] = command.arrival_time
            self._abort_timed_out(engine, unscheduled)
            if not engine.has_unfinished_requests():
                continue
            outputs = engine.step()
            for out in outputs:
                if out.first_scheduled_time is not None or out.request_finished:
                    unscheduled.pop(out.request_id, None)
            if self._fault_token_latency_s and outputs:
                time.sleep(self._fault_token_latency_s)
            self._post(self._on_step, outputs, self._stats(engine))

    def _take_commands(self, block: bool) -> list[_Add | _Abort | object]:
        commands = [self._commands.get()] if block else []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _abort_timed_out(self, engine: LLMEngine, unscheduled: dict[str, float]) -> None:
        timeout = self.limits.queue_timeout_s
        if not timeout:
            return
        now = time.monotonic()
        for request_id in [rid for rid, arrival in unscheduled.items() if now - arrival > timeout]:
            del unscheduled[request_id]
            # Posted before the step whose output reports the abort, so it is counted as a timeout.
            self._post(self._on_timed_out, request_id)
            engine.abort_request(request_id)
