"""Request and response bodies in OpenAI's shapes (the subset this engine can honour).

Options the engine cannot honour are typed so that only their neutral value validates: a client that
asks for them gets a 400 naming the field instead of a silently different answer.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kubeinfer_runtime.engine.types import Grammar, SamplingParams
from kubeinfer_runtime.server.errors import APIError
from kubeinfer_runtime.server.tool_calls import Mode, tool_grammar

MAX_LOGPROBS = 20  # OpenAI's limit for top_logprobs; the engine's too
# Parameters vLLM accepts that this server does not honour: named in a 400 rather than ignored.
REFUSED_EXTRA_PARAMS = (
    "min_p",
    "use_beam_search",
    "length_penalty",
    "include_stop_str_in_output",
    "bad_words",
    "allowed_token_ids",
    "prompt_logprobs",
    "truncate_prompt_tokens",
    "guided_grammar",  # its dialect depends on vLLM's grammar backend
    "spaces_between_special_tokens",
)


class StreamOptions(BaseModel):
    include_usage: bool = False


class JSONSchemaFormat(BaseModel):
    name: str = Field(max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None  # enforced either way: every output token is masked by the schema


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("json_schema is required when type is 'json_schema'")
        return self

    def grammar(self) -> Grammar | None:
        if self.type == "json_object":
            return Grammar("json_object", "")
        if self.json_schema is not None and self.type == "json_schema":
            return Grammar("json_schema", json.dumps(self.json_schema.schema_))
        return None


def choice_grammar(choices: list[str]) -> Grammar:
    """Exactly one of `choices` (vLLM's guided_choice), as a Lark grammar of string literals."""
    return Grammar("lark", "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices))


class _GenerationRequest(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow")  # unknown fields are ignored, except REFUSED_EXTRA_PARAMS

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    skip_special_tokens: bool = True
    # Lower runs first (vLLM's convention); the X-Request-Priority header overrides it.
    priority: int = 0
    n: int = Field(1, ge=1, le=128)
    response_format: ResponseFormat | None = None
    # vLLM's names for the same constraint.
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: None = None

    def grammar(self) -> Grammar | None:
        """The constraint on the output, from whichever one field asks for it."""
        given = {
            "response_format": self.response_format.grammar() if self.response_format else None,
            "guided_json": None
            if self.guided_json is None
            else Grammar(
                "json_schema",
                self.guided_json if isinstance(self.guided_json, str) else json.dumps(self.guided_json),
            ),
            "guided_regex": None if self.guided_regex is None else Grammar("regex", self.guided_regex),
            "guided_choice": None if self.guided_choice is None else choice_grammar(self.guided_choice),
        }
        named = [name for name, grammar in given.items() if grammar is not None]
        if len(named) > 1:
            raise APIError(400, f"only one of {', '.join(named)} may be given", param=named[1])
        return given[named[0]] if named else None

    def refuse_unhonoured_extras(self) -> None:
        for name in REFUSED_EXTRA_PARAMS:
            if (self.model_extra or {}).get(name) is not None:
                raise APIError(400, f"{name} is not supported by this server", param=name, code="unsupported")

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling_params(self, max_tokens: int, **engine_fields: Any) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=stop,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            skip_special_tokens=self.skip_special_tokens,
            grammar=self.grammar(),
            **({"n": self.n} | engine_fields),
        )


class CompletionRequest(_GenerationRequest):
    # One prompt, or a batch of them (text or token ids): each gets n choices.
    prompt: str | list[str] | list[int] | list[list[int]] = Field(min_length=1)
    max_tokens: int = Field(16, ge=1)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=128)
    suffix: None = None

    @model_validator(mode="after")
    def _check_best_of(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) must be at least n ({self.n})")
        if self.stream and self.best_of is not None and self.best_of > self.n:
            raise ValueError("best_of > n cannot be streamed")
        return self

    @property
    def num_sequences(self) -> int:
        """Sequences generated per prompt: best_of of them, of which the n most likely are returned."""
        return self.best_of or self.n

    def prompts(self) -> list[str | list[int]]:
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], int):
            return [self.prompt]  # type: ignore[list-item]
        return list(self.prompt)  # type: ignore[arg-type]

    def engine_params(self, max_tokens: int) -> SamplingParams:
        # best_of ranks sequences by their cumulative logprob, which the engine tracks with logprobs.
        ranked = self.num_sequences > self.n
        logprobs = self.logprobs if self.logprobs is not None or not ranked else 0
        return self.sampling_params(
            max_tokens,
            n=self.num_sequences,
            logprobs=logprobs,
            prompt_logprobs=self.logprobs if self.echo and self.logprobs is not None else None,
        )


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = ""
    tool_calls: list[ToolCallOut] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers
    name: str | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(p.text for p in self.content)

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates read it: text content, and tool call arguments as objects
        (the Hugging Face convention, which templates such as Qwen's and Llama's rely on)."""
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": c.type,
                    "function": {"name": c.function.name, "arguments": _json_or_text(c.function.arguments)},
                }
                for c in self.tool_calls
            ]
        message |= {
            k: v for k, v in (("tool_call_id", self.tool_call_id), ("name", self.name)) if v is not None
        }
        return message


def _json_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


class FunctionDefinition(BaseModel):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: FunctionName


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    # Unset: up to the model's context length, as vLLM does.
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    @model_validator(mode="after")
    def _check_logprobs_and_tools(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        names = {t.function.name for t in self.tools or ()}
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise ValueError(
                f"tool_choice names function {self.tool_choice.function.name!r}, which tools do not define"
            )
        if self.tool_choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs tools")
        return self

    @property
    def tool_mode(self) -> Mode:
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        return self.tool_choice or ("auto" if self.tools else "none")

    @property
    def named_tool(self) -> str | None:
        return self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else None

    def tool_dicts(self) -> list[dict[str, Any]]:
        return [t.model_dump(exclude_none=True) for t in self.tools or ()]

    def grammar(self) -> Grammar | None:
        constraint = tool_grammar(
            self.tool_mode, self.tool_dicts(), self.named_tool, self.parallel_tool_calls
        )
        if constraint is None:
            return super().grammar()
        if super().grammar() is not None:
            raise APIError(
                400, "a forced tool call cannot be combined with response_format", param="tool_choice"
            )
        return constraint

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def engine_params(self, max_tokens: int) -> SamplingParams:
        return self.sampling_params(max_tokens, logprobs=(self.top_logprobs or 0) if self.logprobs else None)


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


class CompletionLogprobs(BaseModel):
    """The legacy completions shape: parallel lists, one entry per token (None for a prompt's first)."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] = Field(default_factory=list)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]
    refusal: None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    # OpenAI's deltas: {"index", "id", "type", "function": {"name", "arguments"}} on a call's first
    # chunk, then {"index", "function": {"arguments"}} pieces; fields absent, not null, when unsent.
    tool_calls: list[dict[str, Any]] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kubeinfer"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
