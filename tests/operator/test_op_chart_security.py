"""The chart's security settings, rendered by the real helm."""

from __future__ import annotations

import json
from pathlib import Path

from test_op_monitoring_chart import helm, template  # noqa: F401  (helm is the fixture the tests take)

LOOKALIKES = ["on", "null", "true", "yes", "2024", "1e3"]


def test_namespaces_yaml_would_retype_render_as_strings(helm: Path) -> None:  # noqa: F811
    docs = template(helm, "--set-json", f"watchNamespaces={json.dumps(LOOKALIKES)}", namespace="on")
    bindings = [d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole"]
    assert [b["metadata"]["namespace"] for b in bindings] == LOOKALIKES
    assert all(b["subjects"][0]["namespace"] == "on" for b in bindings)
    namespaced = [d for d in docs if "namespace" in d["metadata"]]
    assert namespaced and all(d["metadata"]["namespace"] == "on" for d in namespaced if d not in bindings)
