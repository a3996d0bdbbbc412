"""The kubeinfer Grafana dashboard, generated: one service (and any of its revisions) at a time — latency
percentiles against the SLO, queue time, KV-cache usage, desired against ready replicas, scaling decisions,
canary weight, and the error budget left.

    python -m kubeinfer_operator.dashboard            # writes charts/kubeinfer/dashboards/kubeinfer.json
    python -m kubeinfer_operator.dashboard --check    # exit 1 when that file is stale

Series come from the runtime pods (kubeinfer_*, labelled namespace / inferenceservice / revision / track by
the scrape config), the operator's /metrics (service_metrics.py: kubeinfer_inferenceservice_*, labelled
inferenceservice_namespace) and the SLO recording rules (slo_alerts.py: kubeinfer:slo_*).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kubeinfer_operator.slo_alerts import BAD_RATIO, BUDGET, PERIOD

OUTPUT = Path(__file__).resolve().parents[2] / "charts" / "kubeinfer" / "dashboards" / "kubeinfer.json"
UID = "kubeinfer-service"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PODS = 'namespace="$namespace",inferenceservice="$service",revision=~"$revision"'
SERVICE = 'namespace="$namespace",inferenceservice="$service"'
OPERATOR = 'inferenceservice_namespace="$namespace",inferenceservice="$service"'
RATE = "$__rate_interval"


def _quantiles(histogram: str) -> list[tuple[str, str]]:
    return [
        (
            f"histogram_quantile({q}, sum by (le, revision) (rate({histogram}_bucket{{{PODS}}}[{RATE}])))",
            f"p{round(q * 100)} {{{{revision}}}}",
        )
        for q in (0.5, 0.95, 0.99)
    ]


# (title, unit, panel type, [(expr, legend)]) in reading order: two panels a row.
PANELS: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    ("Time to first token", "s", "timeseries", _quantiles("kubeinfer_time_to_first_token_seconds")),
    ("Time per output token", "s", "timeseries", _quantiles("kubeinfer_time_per_output_token_seconds")),
    ("End-to-end latency", "s", "timeseries", _quantiles("kubeinfer_e2e_request_latency_seconds")),
    (
        "Queue time",
        "s",
        "timeseries",
        [
            (
                "histogram_quantile(0.95, sum by (le, revision) "
                f"(rate(kubeinfer_request_queue_time_seconds_bucket{{{PODS}}}[{RATE}])))",
                "p95 {{revision}}",
            ),
            (
                f"max by (revision) (kubeinfer_oldest_waiting_request_age_seconds{{{PODS}}})",
                "oldest wait {{revision}}",
            ),
        ],
    ),
    (
        "KV-cache usage",
        "percentunit",
        "timeseries",
        [(f"avg by (revision) (kubeinfer_kv_cache_usage_ratio{{{PODS}}})", "{{revision}}")],
    ),
    (
        "Requests",
        "reqps",
        "timeseries",
        [
            (
                f"sum by (revision, outcome) (rate(kubeinfer_requests_total{{{PODS}}}[{RATE}]))",
                "{{revision}} {{outcome}}",
            )
        ],
    ),
    (
        "Desired vs ready replicas",
        "short",
        "timeseries",
        [
            (f"max(kubeinfer_inferenceservice_desired_replicas{{{OPERATOR}}})", "desired"),
            (f"max(kubeinfer_inferenceservice_ready_replicas{{{OPERATOR}}})", "ready"),
            (f"max(kubeinfer_inferenceservice_replicas{{{OPERATOR}}})", "existing"),
        ],
    ),
    (
        "Scaling decisions",
        "short",
        "timeseries",
        [
            (
                "max by (signal, direction) "
                f"(increase(kubeinfer_inferenceservice_scaling_decisions_total{{{OPERATOR}}}[5m]))",
                "{{direction}} on {{signal}}",
            )
        ],
    ),
    (
        "Canary weight",
        "percent",
        "timeseries",
        [(f"max(kubeinfer_inferenceservice_canary_weight_percent{{{OPERATOR}}})", "canary weight")],
    ),
    (
        "Requests waiting and running",
        "short",
        "timeseries",
        [
            (f"sum by (revision) (kubeinfer_requests_waiting{{{PODS}}})", "waiting {{revision}}"),
            (f"sum by (revision) (kubeinfer_requests_running{{{PODS}}})", "running {{revision}}"),
        ],
    ),
    (
        f"Error budget left ({PERIOD})",
        "percentunit",
        "stat",
        [
            (
                f"1 - avg_over_time({BAD_RATIO}:rate5m{{{SERVICE}}}[{PERIOD}])"
                f" / on (namespace, inferenceservice, slo) {BUDGET}{{{SERVICE}}}",
                "{{slo}}",
            )
        ],
    ),
    (
        "Error budget burn rate",
        "short",
        "timeseries",
        [
            (
                f"{BAD_RATIO}:rate{window}{{{SERVICE}}}"
                f" / on (namespace, inferenceservice, slo) {BUDGET}{{{SERVICE}}}",
                f"{{{{slo}}}} over {window}",
            )
            for window in ("1h", "5m")
        ],
    ),
]


def _panel(index: int, title: str, unit: str, kind: str, targets: list[tuple[str, str]]) -> dict[str, Any]:
    panel: dict[str, Any] = {
        "id": index + 1,
        "type": kind,
        "title": title,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }
    if kind == "timeseries":
        panel["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom"},
            "tooltip": {"mode": "multi"},
        }
    else:
        panel["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"}
    return panel


def _variable(name: str, label: str, query: str, multi: bool = False) -> dict[str, Any]:
    variable: dict[str, Any] = {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": multi,
        "includeAll": multi,
    }
    if multi:
        variable["allValue"] = ".*"
        variable["current"] = {"text": "All", "value": "$__all"}
    return variable


def dashboard() -> dict[str, Any]:
    return {
        "uid": UID,
        "title": "kubeinfer / InferenceService",
        "description": "An InferenceService against its SLO: latency, queueing, KV cache, replicas, rollout.",
        "tags": ["kubeinfer", "llm", "slo"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
                _variable("namespace", "namespace", "label_values(kubeinfer_requests_total, namespace)"),
                _variable(
                    "service",
                    "InferenceService",
                    'label_values(kubeinfer_requests_total{namespace="$namespace"}, inferenceservice)',
                ),
                _variable(
                    "revision",
                    "revision",
                    f"label_values(kubeinfer_requests_total{{{SERVICE}}}, revision)",
                    True,
                ),
            ]
        },
        "panels": [_panel(i, *spec) for i, spec in enumerate(PANELS)],
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubeinfer_operator.dashboard")
    parser.add_argument("--check", action="store_true", help="exit 1 when the chart's copy is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run `make dashboards`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
