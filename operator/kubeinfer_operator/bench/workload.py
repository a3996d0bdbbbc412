"""What a benchmark sends and when: arrival times, length distributions, prompts, datasets.

All randomness comes from one seeded `random.Random`, so a run can be repeated exactly.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Short, common English words: most BPE tokenizers spend one token on each (with its leading
# space), so N words is close to N tokens. The client cannot know the server's tokenizer; the
# server's usage.prompt_tokens gives the real count.
_WORDS_TEXT = (
    "the of and to in is was for on are as with his they at be this from have or by one had not but "
    "what all were when we there can an your which their said if do will each about how up out them "
    "then she many some so these would other into has more her two like him see time could no make "
    "than first been its who now people my made over did down only way find use may water long little "
    "very after words called just where most know get through back much before go good new write our "
    "used me man too any day same right look think also around another came come work three word must"
)
_WORDS = _WORDS_TEXT.split()


_ARITY = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2}  # distribution -> its parameters


@dataclass(frozen=True)
class LengthDistribution:
    """Token lengths: fixed, uniform[low, high], normal(mean, std) or lognormal(median, sigma)."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str, field: str) -> LengthDistribution:
        """Read "128" (fixed), "uniform:64:256", "normal:128:32" or "lognormal:128:0.5"."""
        parts = str(text).split(":")
        if len(parts) == 1:
            parts = ["fixed", *parts]
        kind, *numbers = parts
        arity = _ARITY.get(kind)
        if arity is None:
            raise ValueError(f"{field}: unknown distribution {kind!r}; expected one of {', '.join(_ARITY)}")
        try:
            values = [float(n) for n in numbers]
        except ValueError:
            raise ValueError(f"{field}: {text!r} has a parameter that is not a number") from None
        if len(values) != arity:
            raise ValueError(f"{field}: {kind} takes {arity} parameter(s), got {text!r}")
        if values[0] < 1 or (kind == "uniform" and values[1] < values[0]) or (arity == 2 and values[1] < 0):
            raise ValueError(f"{field}: {text!r}: lengths must be >= 1 (and uniform's high >= low)")
        return cls(kind, *values)

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.uniform(self.a, self.b)
        elif self.kind == "normal":
            value = rng.normalvariate(self.a, self.b)
        else:
            value = rng.lognormvariate(math.log(self.a), self.b)
        return max(1, round(value))


@dataclass(frozen=True)
class RequestSpec:
    """One request: either a completion prompt or chat messages, and how many tokens to generate."""

    prompt: str | None
    messages: list[dict] | None
    max_tokens: int


def synthetic_prompt(num_tokens: int, rng: random.Random) -> str:
    """About `num_tokens` tokens of random words: random, so requests never share a cached prefix."""
    return " ".join(rng.choice(_WORDS) for _ in range(num_tokens))


def synthetic_requests(
    count: int, input_len: LengthDistribution, output_len: LengthDistribution, rng: random.Random
) -> list[RequestSpec]:
    return [
        RequestSpec(synthetic_prompt(input_len.sample(rng), rng), None, output_len.sample(rng))
        for _ in range(count)
    ]


def load_dataset(path: Path, default_output_len: LengthDistribution, rng: random.Random) -> list[RequestSpec]:
    """A JSONL file, one request a line: {"prompt": str} or {"messages": [...]}, optional "max_tokens"."""
    requests: list[RequestSpec] = []
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object with 'prompt' or 'messages'")
            requests.append(_dataset_request(record, where, default_output_len, rng))
    if not requests:
        raise ValueError(f"{path}: the dataset holds no requests")
    return requests


def _dataset_request(
    record: dict, where: str, default_output_len: LengthDistribution, rng: random.Random
) -> RequestSpec:
    prompt, messages = record.get("prompt"), record.get("messages")
    if (prompt is None) == (messages is None):
        raise ValueError(f"{where}: needs exactly one of 'prompt' (a string) or 'messages' (a list)")
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError(f"{where}: 'prompt' must be a string")
    if messages is not None and not (
        isinstance(messages, list) and messages and all(isinstance(m, dict) and "role" in m for m in messages)
    ):
        raise ValueError(f"{where}: 'messages' must be a non-empty list of objects with a 'role'")
    max_tokens = record.get("max_tokens")
    if max_tokens is None:
        max_tokens = default_output_len.sample(rng)
    elif not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"{where}: 'max_tokens' must be a positive integer")
    return RequestSpec(prompt, messages, max_tokens)


def arrival_offsets(count: int, rate: float, burstiness: float, rng: random.Random) -> Iterator[float]:
    """Send times in seconds from the start, `rate` requests/s on average.

    Gaps are gamma-distributed with shape `burstiness` and mean 1/rate (as in `vllm bench serve`):
    burstiness 1 is a Poisson process, below 1 burstier, above 1 more regular. An infinite rate sends
    everything at once (a fixed concurrency then limits how many are in flight).
    """
    if rate <= 0 or burstiness <= 0:
        raise ValueError("request rate and burstiness must be positive")
    offset = 0.0
    for _ in range(count):
        yield offset
        if math.isfinite(rate):
            offset += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
