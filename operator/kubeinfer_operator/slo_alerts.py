"""spec.slo -> Prometheus recording rules and multiwindow, multi-burn-rate alerts (Google SRE workbook,
"Alerting on SLOs", the method Sloth and Pyrra generate), per InferenceService.

Every objective becomes a *bad-event ratio* with an error budget:
- errorRate: requests that failed (error, timeout, refused with 429) over requests that ended, cancelled
  ones left out; budget = spec.slo.errorRate.
- a latency percentile, e.g. TTFT p95 <= 2s: requests slower than 2 s over all requests; budget = 5%.
  "Slower than the target" is read from the histogram's buckets around the target, interpolated inside
  the bucket exactly as histogram_quantile does, so "p95 <= 2s" in status (and in the canary analysis)
  and "fewer than 5% of requests over 2s" here agree.

The ratio is recorded over each alert window (kubeinfer:slo_bad_ratio:rate<window>, labelled slo=...),
and an alert fires when both a long and a short window burn the budget faster than the tier's factor:
the long window makes the alert precise, the short one lets it resolve soon after the burn stops.

| severity | burn rate | long | short | budget of a 30-day period spent when it fires |
| page     | 14.4x     | 1h   | 5m    | 2% |
| page     | 6x        | 6h   | 30m   | 5% |
| ticket   | 3x        | 1d   | 2h    | 10% |
| ticket   | 1x        | 3d   | 6h    | 10% |

A tier whose threshold (factor x budget) is 1 or more can never fire (p50 objectives: budget 50%) and is
left out. Only the builtin engine is covered: vLLM exports no failure count and its buckets differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubeinfer_operator.api import InferenceServiceSpec
from kubeinfer_operator.engine_metrics import ENGINES
from kubeinfer_operator.names import FIELD_MANAGER, LABEL_ISVC, LABEL_MANAGED_BY
from kubeinfer_operator.render import Owner
from kubeinfer_operator.rollout.analysis import LatencyObjective
from kubeinfer_operator.rollout.controller import slo_targets
from kubeinfer_operator.settings import Settings

# The runtime's histogram buckets (kubeinfer_runtime/server/metrics.py; a test keeps the two equal): the
# operator never imports the runtime, the two meet through metric names and these bounds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5, 5)
BUCKETS = {"ttft": LATENCY_BUCKETS, "tpot": TOKEN_BUCKETS, "e2e": LATENCY_BUCKETS}

FAILED_OUTCOMES = "error|timeout|rejected"  # as the SLO defines errorRate: 5xx, timeouts and 429s
ENDED_OUTCOMES = "success|error|timeout|rejected"  # a cancelled request is neither good nor bad
BAD_RATIO = "kubeinfer:slo_bad_ratio"  # + ":rate<window>"
BUDGET = "kubeinfer:slo_error_budget"
ALERT = "InferenceServiceErrorBudgetBurn"
PERIOD = "30d"  # the SLO period the tiers are sized for


@dataclass(frozen=True)
class Tier:
    severity: str
    factor: float
    long: str
    short: str


TIERS = (
    Tier("page", 14.4, "1h", "5m"),
    Tier("page", 6, "6h", "30m"),
    Tier("ticket", 3, "1d", "2h"),
    Tier("ticket", 1, "3d", "6h"),
)
WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")


@dataclass(frozen=True)
class Objective:
    slo: str  # label value: error-rate, ttft-p95, ...
    budget: float  # fraction of events allowed to be bad
    description: str  # for people: "TTFT p95 <= 2s"
    latency: LatencyObjective | None  # None: the error-rate objective


def objectives(spec: InferenceServiceSpec) -> tuple[Objective, ...]:
    targets = slo_targets(spec)
    found = []
    if spec.slo.error_rate > 0:
        found.append(
            Objective("error-rate", spec.slo.error_rate, f"error rate <= {spec.slo.error_rate:g}", None)
        )
    for o in targets.latency:
        name = f"{o.metric}-p{o.quantile * 100:g}"
        found.append(
            Objective(
                name,
                round(1 - o.quantile, 6),
                f"{o.metric.upper()} p{o.quantile * 100:g} <= {o.target_s:g}s",
                o,
            )
        )
    return tuple(found)


def le(bound: float) -> str:
    """A bucket bound as the `le` label value Prometheus stores: Prometheus 3 normalizes `le` to the
    shortest float form with a decimal point ("1.0", "0.25"), the form Python's client writes too."""
    return repr(float(bound))


def _rate(series: str, window: str) -> str:
    return f"sum by (namespace, inferenceservice) (rate({series}[{window}]))"


def bad_ratio_expr(objective: Objective, selector: str, window: str) -> str:
    """PromQL for the objective's bad-event ratio over `window`; `selector` is the matchers, no braces.
    A window without requests has no sample (not NaN): alerts stay quiet, and averages over long spans
    (the dashboard's budget left) count only the windows that had traffic."""
    if objective.latency is None:
        requests = ENGINES["builtin"].outcomes
        failed = _rate(f'{requests}{{{selector},outcome=~"{FAILED_OUTCOMES}"}}', window)
        ended = _rate(f'{requests}{{{selector},outcome=~"{ENDED_OUTCOMES}"}}', window)
        return f"{failed}\n/\n({ended} > 0)"
    metric = objective.latency.metric
    histogram = getattr(ENGINES["builtin"], metric)
    good = good_rate_expr(histogram, BUCKETS[metric], objective.latency.target_s, selector, window)
    return f"1 - (\n{good}\n)\n/\n({_rate(f'{histogram}_count{{{selector}}}', window)} > 0)"


def good_rate_expr(
    histogram: str, buckets: tuple[float, ...], target_s: float, selector: str, window: str
) -> str:
    """Rate of observations at most `target_s`, assuming them spread evenly inside the bucket that holds
    the target (as histogram_quantile does; the first bucket starts at 0). A target past the last finite
    bound counts only what that bound holds: the +Inf bucket says nothing of how slow."""

    def bucket(bound: float) -> str:
        return _rate(f'{histogram}_bucket{{{selector},le="{le(bound)}"}}', window)

    upper = next((b for b in buckets if b >= target_s), None)
    if upper is None:
        return bucket(buckets[-1])
    if upper == target_s:
        return bucket(upper)
    lower = max((b for b in buckets if b < target_s), default=0.0)
    share = (target_s - lower) / (upper - lower)
    if lower == 0.0:
        return f"{bucket(upper)} * {share:.6g}"
    return f"{bucket(lower)}\n+ ({bucket(upper)} - {bucket(lower)}) * {share:.6g}"


def group_name(namespace: str, name: str) -> str:
    return f"kubeinfer-slo.{namespace}.{name}"


def rule_groups(namespace: str, name: str, spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """The Prometheus rule groups (a rule file's `groups`, a PrometheusRule's `spec.groups`); empty for
    engines whose metrics do not carry the objectives."""
    if spec.runtime.engine != "builtin":
        return []
    selector = f'namespace="{namespace}",inferenceservice="{name}"'
    identity = {"namespace": namespace, "inferenceservice": name}
    rules: list[dict[str, Any]] = []
    for objective in objectives(spec):
        labels = {**identity, "slo": objective.slo}
        rules.append({"record": BUDGET, "expr": f"vector({objective.budget:g})", "labels": labels})
        rules += [
            {
                "record": f"{BAD_RATIO}:rate{w}",
                "expr": bad_ratio_expr(objective, selector, w),
                "labels": labels,
            }
            for w in WINDOWS
        ]
        rules += [_alert(objective, tier, labels) for tier in TIERS if tier.factor * objective.budget < 1]
    return [{"name": group_name(namespace, name), "rules": rules}] if rules else []


def _alert(objective: Objective, tier: Tier, labels: dict[str, str]) -> dict[str, Any]:
    threshold = f"{tier.factor:g} * {objective.budget:g}"
    matchers = ",".join(f'{k}="{v}"' for k, v in labels.items())
    spent = tier.factor * _hours(tier.long) / _hours(PERIOD)
    return {
        "alert": ALERT,
        "expr": (
            f"{BAD_RATIO}:rate{tier.long}{{{matchers}}} > ({threshold})\n"
            f"and\n{BAD_RATIO}:rate{tier.short}{{{matchers}}} > ({threshold})"
        ),
        "labels": {
            **labels,
            "severity": tier.severity,
            "burn_rate": f"{tier.factor:g}",
            "long_window": tier.long,
            "short_window": tier.short,
        },
        "annotations": {
            "summary": (
                f"{labels['namespace']}/{labels['inferenceservice']} burns its {objective.slo} error budget "
                f"{tier.factor:g}x too fast"
            ),
            "description": (
                f"SLO {objective.description}: over the last {tier.long} and {tier.short}, more than "
                f"{tier.factor * objective.budget:.4g} of requests were bad (budget {objective.budget:g}). "
                f"At this rate {spent:.0%} of the {PERIOD} budget is gone in {tier.long}. Bad ratio over "
                f"{tier.long}: {{{{ $value | humanizePercentage }}}}. See `kubeinfer status "
                f"{labels['inferenceservice']} -n {labels['namespace']}`."
            ),
        },
    }


def _hours(window: str) -> float:
    unit = {"m": 1 / 60, "h": 1, "d": 24}[window[-1]]
    return float(window[:-1]) * unit


def render_prometheus_rule(
    namespace: str,
    name: str,
    spec: InferenceServiceSpec,
    owner_reference: dict[str, Any],
    extra_labels: dict[str, str] | None = None,
) -> dict[str, Any] | None:
    """The PrometheusRule (monitoring.coreos.com/v1) holding the service's rule groups, owned by it so it
    goes with it; None when there is nothing to alert on."""
    groups = rule_groups(namespace, name, spec)
    if not groups:
        return None
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": f"{name}-slo",
            "namespace": namespace,
            "labels": {**(extra_labels or {}), LABEL_ISVC: name, LABEL_MANAGED_BY: FIELD_MANAGER},
            "ownerReferences": [owner_reference],
        },
        "spec": {"groups": groups},
    }


def alert_objects(
    settings: Settings, isvc: dict[str, Any], spec: InferenceServiceSpec, served: bool
) -> tuple[dict[str, Any], ...]:
    """What the reconcile applies for the SLO's alerts: the PrometheusRule when alerts are on and the
    cluster serves the kind, else nothing (a rule left from before is then pruned as not rendered)."""
    if not (settings.slo_alerts and served):
        return ()
    meta = isvc["metadata"]
    owner = Owner(meta["name"], meta["namespace"], meta["uid"])
    rule = render_prometheus_rule(
        owner.namespace, owner.name, spec, owner.reference(), dict(settings.monitoring_labels)
    )
    return (rule,) if rule else ()
