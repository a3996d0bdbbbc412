"""The SLO's recording rules and burn-rate alerts: the pure rendering, then `promtool check rules` and
`promtool test rules` (the real Prometheus rule engine, built with the cluster binaries) on synthetic
series that burn the budget fast, burn it slowly, burned and stopped, and do not burn."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeinfer_operator.alerts_command import dump
from kubeinfer_operator.alerts_command import main as alerts_main
from kubeinfer_operator.api import InferenceServiceSpec
from kubeinfer_operator.settings import Settings
from kubeinfer_operator.slo_alerts import (
    ALERT,
    BUCKETS,
    LATENCY_BUCKETS,
    TIERS,
    TOKEN_BUCKETS,
    alert_objects,
    le,
    objectives,
    rule_groups,
)

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "prod"


def spec(**slo: Any) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {"model": {"name": "m", "source": {"hostPath": {"path": "/m"}}}, "slo": slo}
    )


SLO = {"errorRate": 0.05, "ttft": {"p50": "100ms", "p95": "500ms"}, "tpot": {"p95": "250ms"}}


def test_objectives_budget_is_the_error_rate_or_the_share_a_percentile_leaves_over() -> None:
    found = {o.slo: o.budget for o in objectives(spec(**SLO))}
    assert found == {"error-rate": 0.05, "ttft-p50": 0.5, "ttft-p95": 0.05, "tpot-p95": 0.05}


def test_a_tier_that_cannot_fire_is_left_out() -> None:
    """p50's budget is 50%: a 14.4x burn would need 720% bad requests; only the 1x tier can fire."""
    rules = rule_groups(NAMESPACE, "svc", spec(**SLO))[0]["rules"]
    tiers = {(r["labels"]["slo"], r["labels"]["burn_rate"]) for r in rules if r.get("alert") == ALERT}
    assert {burn for slo, burn in tiers if slo == "ttft-p50"} == {"1"}
    assert {burn for slo, burn in tiers if slo == "ttft-p95"} == {f"{t.factor:g}" for t in TIERS}


def test_le_values_are_written_as_prometheus_3_stores_them() -> None:
    assert [le(b) for b in (1, 0.25, 640, 0.001)] == ["1.0", "0.25", "640.0", "0.001"]


def test_buckets_are_the_runtimes() -> None:
    from kubeinfer_runtime.server import metrics

    assert metrics._LATENCY_BUCKETS == LATENCY_BUCKETS
    assert metrics._TOKEN_BUCKETS == TOKEN_BUCKETS


def test_vllm_services_get_no_rules_and_no_object() -> None:
    vllm = InferenceServiceSpec.model_validate(
        {"model": {"name": "m", "source": {"uri": "hf://org/m"}}, "runtime": {"engine": "vllm", "image": "v"}}
    )
    assert rule_groups(NAMESPACE, "svc", vllm) == []
    isvc = {"metadata": {"name": "svc", "namespace": NAMESPACE, "uid": "u"}}
    assert alert_objects(Settings(), isvc, vllm, served=True) == ()


def test_the_rule_object_is_written_only_where_served_and_switched_on() -> None:
    isvc = {"metadata": {"name": "svc", "namespace": NAMESPACE, "uid": "u"}}
    assert alert_objects(Settings(), isvc, spec(**SLO), served=False) == ()
    assert alert_objects(Settings(slo_alerts=False), isvc, spec(**SLO), served=True) == ()
    labels = (("release", "kube-prometheus-stack"),)
    (rule,) = alert_objects(Settings(monitoring_labels=labels), isvc, spec(**SLO), served=True)
    assert rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["ownerReferences"][0]["uid"] == "u"
    assert rule["spec"]["groups"] == rule_groups(NAMESPACE, "svc", spec(**SLO))


# --- promtool -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def promtool() -> Path:
    from localcluster.cluster import binaries

    path = binaries() / "promtool"
    assert path.exists(), f"{path}: e2e/build_binaries.sh did not build promtool"
    return path


SERVICES = ("fast", "slow", "recovered", "calm", "tokens")
MINUTES = 200


def _counter(name: str, labels: dict[str, str], per_minute: list[float]) -> dict[str, str]:
    """A counter in promtool's input notation: a sample a minute, growing by per_minute[i] after sample i."""
    values, total = [], 0.0
    for step in per_minute:
        values.append(f"{total:g}")
        total += step
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{selector}}}", "values": " ".join(values)}


def _labels(service: str) -> dict[str, str]:
    return {"namespace": NAMESPACE, "inferenceservice": service, "pod": f"{service}-0"}


def _requests(service: str, ok: list[float], failed: list[float]) -> list[dict[str, str]]:
    name = "kubeinfer_requests_total"
    return [
        _counter(name, {**_labels(service), "outcome": "success"}, ok),
        _counter(name, {**_labels(service), "outcome": "error"}, failed),
        _counter(name, {**_labels(service), "outcome": "rejected"}, [0.0] * len(ok)),
    ]


def _histogram(service: str, metric: str, observations: dict[float, float]) -> list[dict[str, str]]:
    """A classic histogram receiving `observations` (value -> count) every minute."""
    name = {
        "ttft": "kubeinfer_time_to_first_token_seconds",
        "tpot": "kubeinfer_time_per_output_token_seconds",
    }
    series = []
    for bound in (*BUCKETS[metric], float("inf")):
        per_minute = sum(n for value, n in observations.items() if value <= bound)
        label = "+Inf" if bound == float("inf") else le(bound)
        series.append(
            _counter(f"{name[metric]}_bucket", {**_labels(service), "le": label}, [per_minute] * MINUTES)
        )
    series.append(_counter(f"{name[metric]}_count", _labels(service), [sum(observations.values())] * MINUTES))
    return series


def _input_series() -> list[dict[str, str]]:
    steady = [100.0] * MINUTES
    series = []
    # fast: 90% of requests fail (18x the 5% budget)
    series += _requests("fast", [10.0] * MINUTES, [90.0] * MINUTES)
    # slow: 20% fail (4x): enough for the tickets, not for a page
    series += _requests("slow", [80.0] * MINUTES, [20.0] * MINUTES)
    # recovered: failed hard for the first 90 minutes, then nothing fails
    series += _requests("recovered", steady, [900.0] * 90 + [0.0] * (MINUTES - 90))
    # calm: 2% fail (0.4x)
    series += _requests("calm", [98.0] * MINUTES, [2.0] * MINUTES)
    # tokens: no failures; TTFT fine (all 0.3 s <= 500 ms); TPOT: half of the requests at 0.22 s, inside the
    # (0.2, 0.3] bucket around the 250 ms target, the other half at 0.05 s
    series += _requests("tokens", steady, [0.0] * MINUTES)
    series += _histogram("tokens", "ttft", {0.3: 100.0})
    series += _histogram("tokens", "tpot", {0.05: 50.0, 0.22: 50.0})
    return series


def _alert(value: str, rule: dict[str, Any]) -> dict[str, Any]:
    """The firing alert promtool must see: the rule's labels, its annotations with $value rendered."""
    annotations = {
        k: v.replace("{{ $value | humanizePercentage }}", value) for k, v in rule["annotations"].items()
    }
    return {"exp_labels": rule["labels"], "exp_annotations": annotations}


def _alert_rules(groups: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {
        (r["labels"]["inferenceservice"], r["labels"]["slo"], r["labels"]["burn_rate"]): r
        for g in groups
        for r in g["rules"]
        if r.get("alert")
    }


@pytest.fixture(scope="module")
def rule_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[tuple[str, str, str], Any]]:
    groups = [g for s in SERVICES for g in rule_groups(NAMESPACE, s, spec(**SLO))]
    path = tmp_path_factory.mktemp("rules") / "slo.yml"
    path.write_text(dump({"groups": groups}))
    return path, _alert_rules(groups)


@pytest.mark.slow  # promtool: built with the cluster binaries on first use
def test_promtool_accepts_the_rules(promtool: Path, rule_file: tuple[Path, Any]) -> None:
    checked = subprocess.run(
        [str(promtool), "check", "rules", str(rule_file[0])], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.slow  # promtool: built with the cluster binaries on first use
def test_promtool_accepts_the_rules_kubeinfer_alerts_prints(
    promtool: Path, tmp_path: Path, capsys: Any
) -> None:
    assert alerts_main(["-f", str(ROOT / "examples" / "tiny-cpu.yaml")]) == 0
    path = tmp_path / "tiny.yml"
    path.write_text(capsys.readouterr().out)
    checked = subprocess.run([str(promtool), "check", "rules", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.slow  # promtool: built with the cluster binaries on first use
def test_burn_rate_alerts_fire_by_tier(promtool: Path, rule_file: tuple[Path, Any], tmp_path: Path) -> None:
    path, rules = rule_file

    def firing(service: str, slo: str, value: str, factors: tuple[float, ...]) -> list[dict[str, Any]]:
        return [_alert(value, rules[(service, slo, f"{f:g}")]) for f in factors]

    every = tuple(t.factor for t in TIERS)
    at_65m = [  # every window holds only the burn so far
        *firing("fast", "error-rate", "90%", every),
        *firing("slow", "error-rate", "20%", (3, 1)),  # 4x: the tickets, not a page
        *firing("recovered", "error-rate", "90%", every),
        # half the requests at 0.22 s, read as spread over the (0.2, 0.3] bucket: half of them (25%) > 250 ms
        *firing("tokens", "tpot-p95", "25%", (3, 1)),
        *firing("tokens", "ttft-p50", "100%", (1,)),  # p50: only the 1x tier can fire
    ]
    # recovered, 10 minutes after its failures stopped: its 1h window still burns past 14.4x, but the 5m
    # one is clean, so the page has resolved (the workbook's reason for the short window); the slower tiers'
    # short windows (30m and up) still hold the burn. $value is the long window's ratio.
    recovered = f"{81000 / 91000 * 100:.4g}%"
    at_100m = [
        *firing("fast", "error-rate", "90%", every),
        *firing("slow", "error-rate", "20%", (3, 1)),
        *firing("recovered", "error-rate", recovered, (6, 3, 1)),
        *firing("tokens", "tpot-p95", "25%", (3, 1)),
        *firing("tokens", "ttft-p50", "100%", (1,)),
    ]
    tests = {
        "rule_files": [str(path)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "burn-rate tiers",
                "interval": "1m",
                "input_series": _input_series(),
                "alert_rule_test": [
                    {"eval_time": "65m", "alertname": ALERT, "exp_alerts": at_65m},
                    {"eval_time": "100m", "alertname": ALERT, "exp_alerts": at_100m},
                ],
                "promql_expr_test": [
                    {
                        "expr": f'kubeinfer:slo_bad_ratio:rate5m{{inferenceservice="{s}",slo="{slo}"}}',
                        "eval_time": "30m",
                        "exp_samples": [
                            {
                                "labels": (
                                    f'kubeinfer:slo_bad_ratio:rate5m{{inferenceservice="{s}",'
                                    f'namespace="{NAMESPACE}",slo="{slo}"}}'
                                ),
                                "value": value,
                            }
                        ],
                    }
                    for s, slo, value in (
                        ("calm", "error-rate", 0.02),
                        ("tokens", "tpot-p95", 0.25),
                        ("tokens", "ttft-p95", 0),
                        ("tokens", "ttft-p50", 1),
                    )
                ],
            }
        ],
    }
    test_file = tmp_path / "slo_test.yml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    ran = subprocess.run([str(promtool), "test", "rules", str(test_file)], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr
