"""Jinja templates that lay out Kubernetes objects, with the values put in as data, never as YAML text.

A value written into YAML text is re-read by the YAML parser: a namespace named `on` came back as True,
a service named `null` as None, `2024` as an int, and the apiserver refused the object on every
reconcile. Here each `{{ expression }}` renders as a placeholder token; the template text (ours alone)
is parsed, and each placeholder is then replaced by the value itself, whatever its type or content. So
the parser never sees a user's string, and no quoting rule can be forgotten.

An expression must be a whole YAML scalar (`name: {{ name }}`): one inside a longer string
(`"{{ namespace }}/{{ name }}"`) is refused, since only its text could be spliced in; compute such a
string in Python and pass it whole.
"""

from __future__ import annotations

import copy
import re
from functools import cache
from typing import Any

import jinja2
import yaml

# libyaml's parser where PyYAML was built with it: the pure-Python one was ~95% of a reconcile's time.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# A plain YAML scalar (a string to the parser) that no template writes by itself.
_PLACEHOLDER = re.compile(r"kubeinfer-template-value-(\d+)-end")


class TemplateValueError(ValueError):
    """A template used a value where it cannot be substituted as data."""


class _Values:
    """The values one render emitted, in order; a placeholder carries its index."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    def placeholder(self, value: Any) -> str:
        self.values.append(value)
        return f"kubeinfer-template-value-{len(self.values) - 1}-end"


@cache
def environment(package: str, folder: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader(package, folder),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        # Every expression goes through the render's _Values (passed in the context as `_values`).
        finalize=jinja2.pass_context(lambda context, value: context["_values"].placeholder(value)),
    )


def render_data(template: jinja2.Template, **values: Any) -> Any:
    """The object the template lays out, with each expression's value substituted after parsing."""
    emitted = _Values()
    parsed = yaml.load(template.render(_values=emitted, **values), Loader=_LOADER)
    return _substitute(parsed, emitted.values)


def _substitute(node: Any, values: list[Any]) -> Any:
    if isinstance(node, dict):
        return {_substitute_key(key, values): _substitute(value, values) for key, value in node.items()}
    if isinstance(node, list):
        return [_substitute(item, values) for item in node]
    if isinstance(node, str):
        if match := _PLACEHOLDER.fullmatch(node):
            # A copy: two objects rendered from one value (a pod template in a Deployment) share nothing.
            return copy.deepcopy(values[int(match.group(1))])
        if _PLACEHOLDER.search(node):
            raise TemplateValueError(
                f"a template expression inside the string {node!r}: pass the whole string as one value"
            )
    return node


def _substitute_key(key: Any, values: list[Any]) -> Any:
    if isinstance(key, str) and _PLACEHOLDER.search(key):
        raise TemplateValueError("a template expression as a mapping key: pass the mapping as one value")
    return key
