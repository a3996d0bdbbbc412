"""The base every API model shares, and the cross-field rules that run in two places.

A `Rule` is written once: its CEL text goes into the CRD as `x-kubernetes-validations` (the
apiserver enforces it), and its Python twin runs as a pydantic validator (offline checks, the
operator). Both report the same field path and the same message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

Reason = Literal["FieldValueInvalid", "FieldValueRequired", "FieldValueForbidden"]

# How the apiserver words each reason in its error text ("spec.x: Required value: ...").
REASON_WORDS: dict[str, str] = {
    "FieldValueInvalid": "Invalid value",
    "FieldValueRequired": "Required value",
    "FieldValueForbidden": "Forbidden",
}


@dataclass(frozen=True)
class Rule:
    """A cross-field rule: CEL for the apiserver, `holds` for Python, one message for both."""

    cel: str
    message: str
    holds: Callable[[Any], bool]
    field: str = ""  # CEL fieldPath relative to the model, e.g. ".minReplicas"; "" is the model itself
    reason: Reason = "FieldValueInvalid"

    def to_validation(self) -> dict[str, str]:
        validation = {"rule": self.cel, "message": self.message}
        if self.field:
            validation["fieldPath"] = self.field
        if self.reason != "FieldValueInvalid":
            validation["reason"] = self.reason
        return validation


def camel(name: str) -> str:
    """JSON name of a field: min_replicas -> minReplicas, e2e_p95 -> e2eP95 (pydantic's to_camel
    would write e2E)."""
    first, *rest = name.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


def _add_rules(schema: dict[str, Any], model: type[KubeModel]) -> None:
    if model.rules:
        schema["x-kubernetes-validations"] = [rule.to_validation() for rule in model.rules]


class KubeModel(BaseModel):
    """camelCase JSON names, no unknown fields, no type coercion: the same input the apiserver
    accepts, so offline validation and the cluster agree. Attribute docstrings are the field
    descriptions `kubectl explain` prints."""

    model_config = ConfigDict(
        alias_generator=camel,
        validate_by_name=True,  # Python may say min_replicas=...; manifests may not (see parse_manifest)
        extra="forbid",
        strict=True,
        use_attribute_docstrings=True,
        json_schema_extra=_add_rules,
    )
    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        for rule in self.rules:
            if not rule.holds(self):
                raise PydanticCustomError("rule", rule.message, {"field": rule.field, "reason": rule.reason})
        return self


def _path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def field_errors(error: ValidationError) -> list[str]:
    """One line per problem, each starting with the field path the apiserver would name
    (spec.rollout.steps[1].weight)."""
    lines = []
    for detail in error.errors():
        if detail["type"] == "rule":
            ctx = detail["ctx"]
            relative = tuple(part for part in ctx["field"].split(".") if part)
            words = REASON_WORDS[ctx["reason"]]
            lines.append(f"{_path((*detail['loc'], *relative))}: {words}: {detail['msg']}")
        else:
            message = detail["msg"].removeprefix("Value error, ")
            lines.append(f"{_path(detail['loc'])}: {message}")
    return lines
