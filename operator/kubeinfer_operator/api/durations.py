"""Duration strings ("500ms", "2m", "1h30m") as users write them in manifests.

The grammar is a subset of Go's time.ParseDuration, so CEL's duration() on the apiserver and
parse_duration here agree on every accepted value.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, StringConstraints, WithJsonSchema

DURATION_PATTERN = "^([0-9]+([.][0-9]+)?(ms|s|m|h))+$"  # no backslashes: it is quoted inside CEL too
DURATION_MAX_LENGTH = 32  # bounds the CEL cost estimate of rules that call duration()

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"([0-9]+(?:[.][0-9]+)?)(ms|s|m|h)")
_WHOLE = re.compile(DURATION_PATTERN)


def parse_duration(text: str) -> float:
    """Seconds in a duration string; ValueError with an example of the expected form otherwise."""
    if not isinstance(text, str) or not _WHOLE.match(text):
        raise ValueError(
            f"invalid duration {text!r}: expected numbers with units ms, s, m or h, e.g. 500ms, 2m, 1h30m"
        )
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _PART.findall(text))


def format_duration(seconds: float) -> str:
    """The shortest readable duration string for status fields: 0.2123 -> "212ms", 125 -> "2m5s"."""
    if seconds < 0:
        raise ValueError(f"durations are not negative, got {seconds}")
    if round(seconds * 1000) < 1000:
        return f"{round(seconds * 1000)}ms"
    if round(seconds, 2) < 60:
        return f"{round(seconds, 2):g}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(hours, "h"), (minutes, "m"), (secs, "s")]
    return "".join(f"{value}{unit}" for value, unit in parts if value)


def _check_duration(text: str) -> str:
    parse_duration(text)
    return text


Duration = Annotated[
    str,
    StringConstraints(max_length=DURATION_MAX_LENGTH),
    AfterValidator(_check_duration),
    WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN, "maxLength": DURATION_MAX_LENGTH}),
]
"""A duration string kept as written (so manifests round-trip); parse_duration gives seconds."""
