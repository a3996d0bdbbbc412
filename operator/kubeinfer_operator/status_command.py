"""`kubeinfer status NAME` (and `kubectl infsvc status NAME`): status_screen's one screen for a live
InferenceService, read from the apiserver (the current kubeconfig context, or the pod's ServiceAccount)
and, when a Prometheus URL is given, the SLO's burn rates from the recording rules of `kubeinfer alerts`."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
from typing import Any

import requests
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect

from kubeinfer_operator.api.durations import parse_duration
from kubeinfer_operator.engine_metrics import ENGINES
from kubeinfer_operator.kube import Kube
from kubeinfer_operator.names import KIND
from kubeinfer_operator.slo_alerts import ALERT, BAD_RATIO, BUDGET
from kubeinfer_operator.status_screen import Burn, render


def build_parser(prog: str = "kubeinfer status") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="One screen: SLO, replicas, scaling, rollout.")
    parser.add_argument("name", help="InferenceService name")
    parser.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context")
    parser.add_argument(
        "--prometheus",
        default=os.environ.get("KUBEINFER_PROMETHEUS_URL"),
        help="Prometheus URL for the SLO burn rates (default: $KUBEINFER_PROMETHEUS_URL; unset: none)",
    )
    return parser


def _client(kubeconfig: str | None, context: str | None) -> tuple[client.ApiClient, str]:
    """An API client and the namespace of the context (or of the pod, in a cluster)."""
    try:
        config.load_kube_config(config_file=kubeconfig, context=context)
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        if context:
            contexts, _ = config.list_kube_config_contexts(config_file=kubeconfig)
            active = next(c for c in contexts if c["name"] == context)
        namespace = (active.get("context") or {}).get("namespace") or "default"
    except config.ConfigException:
        config.load_incluster_config()
        namespace = "default"
    return client.ApiClient(), namespace


def burn_rates(url: str, namespace: str, name: str) -> dict[str, Burn]:
    """Bad ratio / error budget per objective over 1h and 5m; empty when the rules are not loaded."""
    prom = PrometheusConnect(url=url, disable_ssl=True)
    sel = f'{{namespace="{namespace}",inferenceservice="{name}"}}'
    found: dict[str, dict[str, float]] = {}
    for window in ("1h", "5m"):
        query = f"{BAD_RATIO}:rate{window}{sel} / on (namespace, inferenceservice, slo) {BUDGET}{sel}"
        for sample in prom.custom_query(query):
            value = float(sample["value"][1])
            if math.isfinite(value):
                found.setdefault(sample["metric"].get("slo", ""), {})[window] = value
    return {slo: Burn(v.get("1h"), v.get("5m")) for slo, v in found.items()}


def percentile_readings(url: str, isvc: dict[str, Any]) -> dict[str, float]:
    """Every latency objective's percentile over slo.window, e.g. {"ttft-p99": 0.41}; none without data."""
    spec, meta = isvc.get("spec") or {}, isvc["metadata"]
    engine = ENGINES.get((spec.get("runtime") or {}).get("engine", "builtin"))
    slo = spec.get("slo") or {}
    if engine is None:
        return {}
    window = f"{max(1, round(parse_duration(slo.get('window', '5m'))))}s"
    sel = f'{{namespace="{meta["namespace"]}",inferenceservice="{meta["name"]}"}}'
    prom = PrometheusConnect(url=url, disable_ssl=True)
    readings: dict[str, float] = {}
    for metric in ("ttft", "tpot", "e2e"):
        for percentile in slo.get(metric) or {}:
            q = int(percentile.removeprefix("p")) / 100
            histogram = getattr(engine, metric)
            query = f"histogram_quantile({q:g}, sum by (le) (rate({histogram}_bucket{sel}[{window}])))"
            for sample in prom.custom_query(query):
                if math.isfinite(value := float(sample["value"][1])):
                    readings[f"{metric}-{percentile}"] = value
    return readings


def firing_alerts(url: str, namespace: str, name: str) -> list[dict[str, str]]:
    """Labels of the service's burn-rate alerts that fire now."""
    prom = PrometheusConnect(url=url, disable_ssl=True)
    sel = f'alertname="{ALERT}",alertstate="firing",namespace="{namespace}",inferenceservice="{name}"'
    return [sample["metric"] for sample in prom.custom_query(f"ALERTS{{{sel}}}")]


def main(argv: list[str], prog: str = "kubeinfer status") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        api, context_namespace = _client(args.kubeconfig, args.context)
    except config.ConfigException as error:
        print(f"{prog}: no cluster credentials: {error}", file=sys.stderr)
        return 2
    namespace = args.namespace or context_namespace
    try:
        isvc = Kube(api).get(KIND, namespace, args.name)
    except ApiException as error:
        print(f"{prog}: reading {namespace}/{args.name}: {error.status} {error.reason}", file=sys.stderr)
        return 1
    if isvc is None:
        print(f"{prog}: InferenceService {namespace}/{args.name} not found", file=sys.stderr)
        return 1
    burns, alerts, percentiles = None, None, None
    if args.prometheus:
        try:
            burns = burn_rates(args.prometheus, namespace, args.name)
            alerts = firing_alerts(args.prometheus, namespace, args.name)
            percentiles = percentile_readings(args.prometheus, isvc)
        except (requests.RequestException, PrometheusApiClientException) as error:
            print(
                f"{prog}: Prometheus at {args.prometheus} did not answer ({error}); no burn rates",
                file=sys.stderr,
            )
    width = shutil.get_terminal_size((100, 40)).columns
    print("\n".join(render(isvc, width=width, burns=burns, alerts=alerts, percentiles=percentiles)))
    return 0
