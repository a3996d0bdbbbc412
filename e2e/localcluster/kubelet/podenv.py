"""A container's environment, as the kubelet composes it: envFrom, then env (later wins), each value's
$(VAR) references expanded against what came before; the downward API (fieldRef, resourceFieldRef)
resolved against the pod; the `kubernetes` Service's address for in-cluster clients."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.utils.quantity import parse_quantity

Obj = dict[str, Any]
Lookup = Callable[[str, str], dict[str, str] | None]  # (namespace, name) -> data, None when absent
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class ConfigError(Exception):
    """A reference the pod needs cannot be resolved (CreateContainerConfigError in a real kubelet)."""


@dataclass(frozen=True)
class PodFacts:
    """What the downward API can reveal about a pod beyond its manifest."""

    pod: Obj
    pod_ip: str
    host_ip: str
    node_allocatable: dict[str, str]


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, undefined ones left as written, $$ is $."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _REF.sub(replace, value)


def field_ref(facts: PodFacts, field_path: str) -> str:
    meta, spec = facts.pod["metadata"], facts.pod["spec"]
    if match := _SUBSCRIPT.match(field_path):
        return str(meta.get(match.group(1), {}).get(match.group(2), ""))
    if field_path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(field_path.split(".")[1], {})
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": facts.pod_ip,
        "status.podIPs": facts.pod_ip,
        "status.hostIP": facts.host_ip,
        "status.hostIPs": facts.host_ip,
    }
    if field_path not in simple:
        raise ConfigError(f"fieldRef.fieldPath {field_path!r} is not supported")
    return simple[field_path]


def resource_field_ref(facts: PodFacts, container: Obj, ref: Obj) -> str:
    """limits.*/requests.* of a container, over a divisor, rounded up; an unset limit is the node's
    allocatable amount, as in a real kubelet."""
    kind, _, resource = ref["resource"].partition(".")
    resources = container.get("resources", {})
    value = resources.get(kind, {}).get(resource)
    if value is None and kind == "limits":
        value = facts.node_allocatable.get(resource)
    if value is None:
        value = "0"
    divisor = parse_quantity(str(ref.get("divisor", "1")))
    return str(math.ceil(parse_quantity(str(value)) / (divisor or 1)))


def container_for(pod: Obj, name: str | None) -> Obj:
    containers = pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
    if name is None:
        return pod["spec"]["containers"][0]
    for c in containers:
        if c["name"] == name:
            return c
    raise ConfigError(f"resourceFieldRef.containerName {name!r} names no container of the pod")


def container_env(
    facts: PodFacts, container: Obj, base: dict[str, str], configmaps: Lookup, secrets: Lookup
) -> dict[str, str]:
    namespace = facts.pod["metadata"]["namespace"]
    env = dict(base)
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef") or source.get("secretRef")
        if ref is None:
            continue
        data = (configmaps if "configMapRef" in source else secrets)(namespace, ref["name"])
        if data is None:
            if ref.get("optional"):
                continue
            raise ConfigError(f"envFrom: {ref['name']!r} not found in namespace {namespace!r}")
        env.update({source.get("prefix", "") + k: v for k, v in data.items()})
    for var in container.get("env", []):
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_ref(facts, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            env[name] = resource_field_ref(
                facts,
                container_for(facts.pod, ref.get("containerName")) if ref.get("containerName") else container,
                ref,
            )
        else:
            key_ref = source.get("configMapKeyRef") or source.get("secretKeyRef")
            if key_ref is None:
                raise ConfigError(f"env {name!r}: valueFrom has no supported source")
            data = (configmaps if "configMapKeyRef" in source else secrets)(namespace, key_ref["name"])
            if data is None or key_ref["key"] not in data:
                if key_ref.get("optional"):
                    continue
                raise ConfigError(f"env {name!r}: key {key_ref['key']!r} of {key_ref['name']!r} not found")
            env[name] = data[key_ref["key"]]
    return env
