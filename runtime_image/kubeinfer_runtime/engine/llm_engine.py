"""LLMEngine: the API the server drives. add_request / abort_request between steps, step() in a loop.

Not thread-safe: one thread (the server's engine loop) calls every method.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from kubeinfer_runtime.engine.block_manager import BlockManager
from kubeinfer_runtime.engine.config import EngineConfig
from kubeinfer_runtime.engine.logits import constrain, token_logprobs
from kubeinfer_runtime.engine.model_runner import ModelRunner, PromptLogits
from kubeinfer_runtime.engine.sampler import GREEDY_TEMPERATURE, sample, sampling_probs
from kubeinfer_runtime.engine.scheduler import Scheduler
from kubeinfer_runtime.engine.sequence import Sequence
from kubeinfer_runtime.engine.spec_decode import (
    NgramIndex,
    draft_room,
    may_speculate,
    verify_greedy,
    verify_sampled,
)
from kubeinfer_runtime.engine.structured import GrammarCompiler
from kubeinfer_runtime.engine.types import (
    EngineStats,
    FinishReason,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
)
from kubeinfer_runtime.models.loader import read_hf_config
from kubeinfer_runtime.models.registry import parse_model_config
from kubeinfer_runtime.tokenizer import Tokenizer


def check_sampling_params(params: SamplingParams) -> None:
    if params.max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < -1:
        raise ValueError(f"top_k must be -1, 0 (both: disabled) or positive, got {params.top_k}")
    if any(not s for s in params.stop):
        raise ValueError("stop strings must be non-empty")
    if params.n < 1:
        raise ValueError(f"n must be >= 1, got {params.n}")
    if params.min_tokens < 0 or params.min_tokens > params.max_tokens:
        raise ValueError(f"min_tokens must be in [0, max_tokens], got {params.min_tokens}")
    if params.repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0, got {params.repetition_penalty}")
    for name in ("presence_penalty", "frequency_penalty"):
        if not -2 <= getattr(params, name) <= 2:
            raise ValueError(f"{name} must be in [-2, 2], got {getattr(params, name)}")
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is not None and not 0 <= value <= MAX_LOGPROBS:
            raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")


MAX_LOGPROBS = 20  # alternatives per position, OpenAI's limit for top_logprobs


def find_stop(text: str, stops: tuple[str, ...], new_from: int) -> int | None:
    """Where the earliest stop string starts in `text`, considering only matches that end after
    `new_from` (earlier text was already checked)."""
    found = [i for s in stops if (i := text.find(s, max(0, new_from - len(s) + 1))) >= 0]
    return min(found, default=None)


def _eos_token_ids(model_dir: Path, hf_config: dict[str, Any], tokenizer: Tokenizer) -> frozenset[int]:
    """EOS ids from the tokenizer, config.json and generation_config.json (chat models list several)."""
    path = model_dir / "generation_config.json"
    generation = json.loads(path.read_text()) if path.is_file() else {}
    ids: set[int | None] = {tokenizer.eos_token_id}
    for value in (hf_config.get("eos_token_id"), generation.get("eos_token_id")):
        ids |= set(value) if isinstance(value, list) else {value}
    return frozenset(i for i in ids if i is not None)


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        model_dir = Path(config.model)
        hf_config = read_hf_config(model_dir)
        self.model_config = parse_model_config(hf_config)
        self.tokenizer = Tokenizer(model_dir)
        self.eos_token_ids = _eos_token_ids(model_dir, hf_config, self.tokenizer)
        self.model_runner = ModelRunner(config, self.model_config)
        self.max_model_len = self.model_runner.max_model_len
        plan = self.model_runner.kv_plan
        self.block_manager = BlockManager(plan.num_blocks, plan.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager)
        self.generator = torch.Generator(self.model_runner.device).manual_seed(config.seed)
        self.grammars = GrammarCompiler(
            str(model_dir / "tokenizer.json"), self.model_config.vocab_size, sorted(self.eos_token_ids)
        )
        # Unfinished requests -> their n sequences; index 0 prefills the prompt, and the others
        # wait here until its blocks are in the prefix cache, then start from them.
        self.sequences: dict[str, list[Sequence]] = {}
        self._siblings: dict[str, list[Sequence]] = {}
        self._aborted: list[Sequence] = []  # aborted since the last step, which reports them
        self._arrivals = itertools.count()
        self.num_draft_tokens = 0  # speculative decoding: draft tokens verified, and accepted
        self.num_accepted_tokens = 0

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, **overrides: Any) -> LLMEngine:
        return cls(EngineConfig(model=model_dir, **overrides))

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> None:
        if request_id in self.sequences:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise ValueError("prompt_token_ids is empty")
        if len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt_token_ids)} tokens but max_model_len is {self.max_model_len} "
                "(the prompt must leave room for at least one output token)"
            )
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_token_ids):
            raise ValueError(f"prompt_token_ids must be in [0, {vocab}) (the model's vocab_size)")
        check_sampling_params(params)
        matcher = self.grammars.matcher(params.grammar) if params.grammar is not None else None
        arrival = time.monotonic() if arrival_time is None else arrival_time
        seqs = []
        for index in range(params.n):
            # Each sequence samples on its own: a seeded request's i-th one uses seed + i (as vLLM).
            own = (
                params
                if index == 0
                else dataclasses.replace(
                    params, prompt_logprobs=None, seed=None if params.seed is None else params.seed + index
                )
            )
            generator = None
            if own.seed is not None:
                generator = torch.Generator(self.model_runner.device).manual_seed(own.seed)
            seq = Sequence(
                request_id,
                prompt_token_ids,
                own,
                priority,
                arrival,
                next(self._arrivals),
                self.tokenizer.detokenizer(prompt_token_ids, params.skip_special_tokens),
                generator,
                index,
                matcher.fork() if matcher is not None and index else matcher,
            )
            if own.prompt_logprobs is not None:
                seq.prompt_logprobs.append(None)  # the first prompt token has no logprob
            seqs.append(seq)
        self.sequences[request_id] = seqs
        self.scheduler.add(seqs[0])
        if self.config.enable_prefix_caching:
            self._siblings[request_id] = seqs[1:]
        else:  # nothing to share: they prefill alongside
            for seq in seqs[1:]:
                self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        seqs = self.sequences.pop(request_id, None)
        if seqs is None:
            return
        not_started = self._siblings.pop(request_id, [])
        for seq in seqs:
            if seq.finish_reason is None:
                if all(seq is not s for s in not_started):
                    self.scheduler.remove(seq)
                seq.finish_reason = FinishReason.ABORT
                self._aborted.append(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.sequences or self._aborted)

    def step(self) -> list[RequestOutput]:
        outputs = [self._output(seq, [], "", time.monotonic()) for seq in self._aborted]
        self._aborted = []
        if self.config.speculative is not None:
            self._propose_drafts()
        scheduled = self.scheduler.schedule(time.monotonic())
        if not scheduled.seqs:
            return outputs
        sampled, logits, prompt_logits = self.model_runner.execute(scheduled.seqs, scheduled.num_new_tokens)
        for part in prompt_logits:
            self._record_prompt_logprobs(part)
        # A sequence with a draft has 1 + len(draft) rows, verified below; every other one has one.
        firsts = list(itertools.accumulate((1 + len(s.draft_token_ids) for s in sampled), initial=0))
        drafted = [i for i, s in enumerate(sampled) if s.draft_token_ids]
        plain = [i for i, s in enumerate(sampled) if not s.draft_token_ids]
        if drafted:
            verified = [(sampled[i], logits[firsts[i] : firsts[i + 1]]) for i in drafted]
            sampled, logits = [sampled[i] for i in plain], logits[[firsts[i] for i in plain]]
        # Log-probabilities come from the raw logits, before any rule below changes them.
        wants = [i for i, s in enumerate(sampled) if s.params.logprobs is not None]
        raw = logits[wants].float().log_softmax(dim=-1) if wants else None
        logits = constrain(logits, sampled, self.eos_token_ids, self.model_runner.device.type == "cuda")
        tokens = sample(logits, [s.params for s in sampled], [s.generator for s in sampled], self.generator)
        logprobs: dict[int, TokenLogprob] = {}
        if raw is not None:
            chosen = [tokens[i] for i in wants]
            num_top = [sampled[i].params.logprobs or 0 for i in wants]
            logprobs = dict(zip(wants, token_logprobs(raw, chosen, num_top), strict=True))
        now = time.monotonic()
        for seq, num_new in zip(scheduled.seqs, scheduled.num_new_tokens, strict=True):
            if not seq.draft_token_ids:  # a drafted sequence counts what verification kept
                seq.num_computed_tokens += num_new
                self.block_manager.cache_full_blocks(seq)
        for i, (seq, token) in enumerate(zip(sampled, tokens, strict=True)):
            outputs.append(self._append_token(seq, token, now, logprobs.get(i)))
            if seq.index == 0:
                self._start_siblings(seq.request_id)
        if drafted:
            outputs += [self._verify_draft(seq, rows, now) for seq, rows in verified]
        return outputs

    def _propose_drafts(self) -> None:
        """Prompt-lookup drafts for the running sequences that may take one (engine/spec_decode.py)."""
        config = self.config
        for seq in self.scheduler.running:
            room = draft_room(seq, config.num_speculative_tokens, self.max_model_len)
            if not (room and may_speculate(seq)):
                seq.draft_token_ids = []  # none, not one left from a step that had no room for it
                continue
            if seq.ngram_index is None:
                seq.ngram_index = NgramIndex(config.ngram_min, config.ngram_max)
            seq.draft_token_ids = seq.ngram_index.propose(seq.token_ids, room)

    def _verify_draft(self, seq: Sequence, rows: torch.Tensor, now: float) -> RequestOutput:
        """Emit what the target model keeps of `seq`'s draft (`rows`: its logits after the last token
        and after each draft token), then roll the cache back to the tokens kept."""
        draft, seq.draft_token_ids = seq.draft_token_ids, []
        if seq.params.temperature < GREEDY_TEMPERATURE:
            tokens = verify_greedy(rows.argmax(dim=-1).tolist(), draft)
        else:
            probs = sampling_probs(rows, [seq.params] * rows.shape[0])
            tokens = verify_sampled(probs, draft, seq.generator or self.generator)
        self.num_draft_tokens += len(draft)
        self.num_accepted_tokens += len(tokens) - 1
        outputs = []
        for token in tokens:
            outputs.append(self._append_token(seq, token, now, None))
            if seq.finish_reason is not None:  # finished and freed: nothing to roll back
                break
        else:
            # Valid keys and values: the last token's and the accepted draft tokens'. The rejected
            # ones' slots are overwritten later; blocks holding only them go back now.
            seq.num_computed_tokens += len(tokens)
            self.block_manager.truncate(seq, seq.num_computed_tokens)
            self.block_manager.cache_full_blocks(seq)
        last = outputs[-1]
        return dataclasses.replace(
            last,
            new_token_ids=[t for o in outputs for t in o.new_token_ids],
            new_text="".join(o.new_text for o in outputs),
            token_times=[t for o in outputs for t in o.token_times],
        )

    def _start_siblings(self, request_id: str) -> None:
        """The prompt's blocks are cached now: the other n - 1 sequences start from them."""
        for seq in self._siblings.pop(request_id, []):
            self.scheduler.add(seq)

    def _record_prompt_logprobs(self, part: PromptLogits) -> None:
        seq = part.seq
        skip = len(seq.prompt_logprobs) - 1 - part.start  # positions already recorded (a recompute)
        rows = part.logits[max(skip, 0) :].float().log_softmax(dim=-1)
        first = part.start + max(skip, 0) + 1
        targets = seq.token_ids[first : first + rows.shape[0]]
        num_top = [seq.params.prompt_logprobs or 0] * len(targets)
        seq.prompt_logprobs += token_logprobs(rows, targets, num_top)

    def _append_token(
        self, seq: Sequence, token: int, now: float, logprob: TokenLogprob | None
    ) -> RequestOutput:
        params = seq.params
        seq.token_ids.append(token)
        if logprob is not None:
            seq.cumulative_logprob += logprob.logprob
        if seq.first_token_time is None:
            seq.first_token_time = now
        if seq.matcher is not None:
            seq.matcher.advance(token)
        reason = None
        if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            reason = FinishReason.STOP  # the stop token's text is not part of the output
        else:
            checked = len(seq.output_text)
            seq.output_text += seq.detokenizer.step(token)
            # Stop strings count only from min_tokens on, as in vLLM.
            stops = params.stop if seq.num_output_tokens > params.min_tokens else ()
            cut = find_stop(seq.output_text, stops, checked) if stops else None
            if cut is not None:
                seq.output_text = seq.output_text[:cut]
                reason = FinishReason.STOP
            elif seq.matcher is not None and seq.matcher.is_finished:
                reason = FinishReason.STOP  # the grammar is complete
        if reason is None and (
            seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len
        ):
            reason = FinishReason.LENGTH
        if reason is None:
            # Hold back a tail that could still become a stop string, so none is ever streamed.
            holdback = max(map(len, params.stop), default=1) - 1
            emit_to = max(seq.num_text_emitted, len(seq.output_text) - holdback)
        else:
            seq.finish_reason = reason
            self.scheduler.remove(seq)
            if all(s.finish_reason is not None for s in self.sequences[seq.request_id]):
                del self.sequences[seq.request_id]
            emit_to = len(seq.output_text)
        new_text = seq.output_text[seq.num_text_emitted : emit_to]
        seq.num_text_emitted = emit_to
        return self._output(seq, [token], new_text, now, [logprob] if logprob is not None else [])

    def _output(
        self,
        seq: Sequence,
        new_tokens: list[int],
        new_text: str,
        now: float,
        new_logprobs: list[TokenLogprob] | None = None,
    ) -> RequestOutput:
        prompt_logprobs = None
        if seq.params.prompt_logprobs is not None and not seq.prompt_logprobs_sent:
            prompt_logprobs, seq.prompt_logprobs_sent = seq.prompt_logprobs, True
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=new_tokens,
            new_text=new_text,
            finished=seq.finish_reason is not None,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_prompt_tokens=seq.num_cached_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            arrival_time=seq.arrival_time,
            first_scheduled_time=seq.first_scheduled_time,
            first_token_time=seq.first_token_time,
            token_times=[now] * len(new_tokens),
            index=seq.index,
            request_finished=seq.request_id not in self.sequences,
            new_logprobs=new_logprobs or [],
            prompt_logprobs=prompt_logprobs,
            cumulative_logprob=seq.cumulative_logprob,
        )

    def stats(self) -> EngineStats:
        now = time.monotonic()
        scheduler, blocks = self.scheduler, self.block_manager
        return EngineStats(
            num_waiting=len(scheduler.waiting),
            num_running=len(scheduler.running),
            oldest_waiting_age_s=max((now - s.arrival_time for s in scheduler.waiting), default=0.0),
            kv_usage=blocks.usage,
            num_blocks_total=blocks.num_blocks,
            num_blocks_free=blocks.num_free_blocks,
            kv_capacity_tokens=self.model_runner.kv_plan.capacity_tokens,
            prefix_cache_queries_total=scheduler.prefix_cache_queries,
            prefix_cache_hits_total=scheduler.prefix_cache_hits,
            preemptions_total=scheduler.num_preemptions,
            spec_draft_tokens_total=self.num_draft_tokens,
            spec_accepted_tokens_total=self.num_accepted_tokens,
        )

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams],
        use_tqdm: bool = False,
    ) -> list[list[int]]:
        """Offline batch generation: every prompt's output token ids, in prompt order."""
        all_params = params if isinstance(params, list) else [params] * len(prompts)
        if len(all_params) != len(prompts):
            raise ValueError(f"got {len(all_params)} SamplingParams for {len(prompts)} prompts")
        if any(p.n > 1 for p in all_params):
            raise ValueError("generate() returns one output per prompt: n must be 1")
        ids = [f"generate-{next(self._arrivals)}" for _ in prompts]
        for request_id, prompt, p in zip(ids, prompts, all_params, strict=True):
            self.add_request(request_id, prompt, p)
        results: dict[str, list[int]] = {request_id: [] for request_id in ids}
        with tqdm(total=len(prompts), desc="Generating", unit="req", disable=not use_tqdm) as bar:
            while any(request_id in self.sequences for request_id in ids):
                for out in self.step():
                    if out.request_id in results:
                        results[out.request_id] += out.new_token_ids
                        bar.update(out.request_finished)
        return [results[request_id] for request_id in ids]
