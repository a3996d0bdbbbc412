"""Structured outputs: the grammar's mask makes even a random-weight model write output that parses
and validates, inside continuous batching (mixed with free requests, n > 1, preemption)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import jsonschema
import pytest
from engine_helpers import assert_all_blocks_free

from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.engine.structured import GrammarError
from kubeinfer_runtime.engine.types import Grammar, RequestOutput, SamplingParams

# A random model never chooses to end a free string or number (the closing token is one of
# hundreds), so every value here is bounded: the mask then guarantees the JSON completes.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 20},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}
ORDERS = {
    "type": "array",
    "minItems": 1,
    "maxItems": 3,
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 999},
            "paid": {"type": "boolean"},
            "status": {"anyOf": [{"const": "open"}, {"const": "closed"}, {"type": "null"}]},
            "item": {"$ref": "#/$defs/item"},
        },
        "required": ["id", "paid", "status", "item"],
        "additionalProperties": False,
    },
    "$defs": {
        "item": {
            "type": "object",
            "properties": {
                "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
                "qty": {"enum": [1, 2, 3]},
            },
            "required": ["sku", "qty"],
            "additionalProperties": False,
        }
    },
}
SEEDS = [None, 0, 1, 2, 3, 4]  # None: greedy


def params(grammar: Grammar | None, seed: int | None, **extra: object) -> SamplingParams:
    settings = {"max_tokens": 400, "temperature": 0.0 if seed is None else 1.0, "seed": seed} | extra
    return SamplingParams(grammar=grammar, **settings)  # type: ignore[arg-type]


def run(
    engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]
) -> dict[str, list[RequestOutput]]:
    for request_id, (prompt, p) in requests.items():
        engine.add_request(request_id, prompt, p)
    outputs: dict[str, list[RequestOutput]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def texts(outs: list[RequestOutput]) -> dict[int, tuple[str, str | None]]:
    """Each sequence's text and finish reason."""
    by_index: dict[int, tuple[str, str | None]] = {}
    for out in outs:
        text, _ = by_index.get(out.index, ("", None))
        by_index[out.index] = (text + out.new_text, out.finish_reason)
    return by_index


@pytest.mark.parametrize("schema", [PERSON, ORDERS], ids=["nested-object-enum-array", "array-anyof-ref"])
def test_every_output_validates_against_its_schema(
    schema: dict, make_engine: Callable[..., LLMEngine]
) -> None:
    engine = make_engine()
    grammar = Grammar("json_schema", json.dumps(schema))
    prompt = engine.tokenizer.encode("Answer in JSON:")
    outputs = run(engine, {f"s{seed}": (prompt, params(grammar, seed)) for seed in SEEDS})
    for outs in outputs.values():
        ((text, reason),) = texts(outs).values()
        assert reason == "stop", text  # the grammar completed, not max_tokens
        jsonschema.validate(json.loads(text), schema)
    assert_all_blocks_free(engine)


def test_json_object_mode_writes_objects(make_engine: Callable[..., LLMEngine]) -> None:
    """Any JSON object is allowed, so a random model's strings may run to max_tokens; what ends parses."""
    engine = make_engine()
    prompt = engine.tokenizer.encode("{")
    outputs = run(engine, {f"s{seed}": (prompt, params(Grammar("json_object", ""), seed)) for seed in SEEDS})
    finished = [texts(outs)[0] for outs in outputs.values()]
    ended = [text for text, reason in finished if reason == "stop"]
    assert ended
    assert all(isinstance(json.loads(text), dict) for text in ended)
    assert all(text.startswith("{") for text, _ in finished)


def test_regex_and_lark_grammars_hold(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine()
    prompt = engine.tokenizer.encode("Code:")
    regex = Grammar("regex", "[A-Z]{2}-[0-9]{3}")
    choice = Grammar("lark", 'start: "red" | "green" | "blue"')
    requests = {f"re{seed}": (prompt, params(regex, seed)) for seed in SEEDS}
    requests |= {f"ch{seed}": (prompt, params(choice, seed)) for seed in SEEDS}
    for request_id, outs in run(engine, requests).items():
        ((text, reason),) = texts(outs).values()
        assert reason == "stop"
        if request_id.startswith("re"):
            assert re.fullmatch("[A-Z]{2}-[0-9]{3}", text), text
        else:
            assert text in {"red", "green", "blue"}


def test_constrained_requests_batch_with_free_ones_n_and_preemption(
    make_engine: Callable[..., LLMEngine],
) -> None:
    grammar = Grammar("json_schema", json.dumps(PERSON))
    free = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    alone = make_engine().generate([list(range(5, 45))], free)[0]
    # A cache too small for everyone at once: sequences are preempted and recomputed mid-JSON.
    engine = make_engine(kv_cache_tokens=320, max_model_len=200)
    prompt = engine.tokenizer.encode("JSON please:")
    requests = {f"c{seed}": (prompt, params(grammar, seed, max_tokens=150)) for seed in [0, 1]}
    requests["free"] = (list(range(5, 45)), free)
    requests["n3"] = (prompt, params(grammar, 9, max_tokens=150, n=3))
    outputs = run(engine, requests)
    assert engine.stats().preemptions_total > 0
    assert [t for o in outputs.pop("free") for t in o.new_token_ids] == alone
    for outs in outputs.values():
        for text, reason in texts(outs).values():
            assert reason == "stop", text
            jsonschema.validate(json.loads(text), PERSON)
    assert len(texts(outputs["n3"])) == 3
    assert_all_blocks_free(engine)


def test_an_invalid_schema_is_refused_with_the_reason(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine()
    with pytest.raises(GrammarError, match="objec"):
        engine.add_request("bad", [5, 6], params(Grammar("json_schema", '{"type": "objec"}'), None))
    assert not engine.has_unfinished_requests()
