"""One terminal screen for an InferenceService: the SLO as measured against its targets, replicas desired
and ready, the last scaling decisions, the rollout's step and its verdicts.

Pure: an InferenceService object as the apiserver returns it (and, when Prometheus answered, the SLO's
burn rates) -> lines of text. `status_command` fetches; this only lays out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubeinfer_operator.api.durations import format_duration, parse_duration

DECISIONS_SHOWN = 5
CONDITION_ORDER = ("Ready", "Progressing", "Degraded", "Reconciling", "Stalled", "SLOMet", "MetricsAvailable")
# The measured percentile in status.signals for each SLO metric (the operator reads p95 only).
MEASURED = {"ttft": "ttftP95", "tpot": "tpotP95", "e2e": "e2eP95"}


@dataclass(frozen=True)
class Burn:
    """Budget burn of one objective (slo label, e.g. ttft-p95): bad ratio / budget over two windows."""

    long: float | None  # over 1h
    short: float | None  # over 5m


def _age(stamp: str | None, now: datetime) -> str:
    if not stamp:
        return "never"
    try:
        then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return stamp
    return f"{format_duration(max(0.0, (now - then).total_seconds()))} ago"


def _clock(stamp: str | None) -> str:
    if not stamp:
        return "-"
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).strftime("%H:%M:%S")
    except ValueError:
        return stamp


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _verdict(measured_s: float | None, target_s: float) -> str:
    if measured_s is None:
        return "no data"
    return "ok" if measured_s <= target_s else "MISSED"


def _duration_or_none(value: Any) -> float | None:
    try:
        return parse_duration(value) if isinstance(value, str) else None
    except ValueError:
        return None


def slo_rows(
    spec: Mapping[str, Any], signals: Mapping[str, Any], percentiles: Mapping[str, float] | None = None
) -> list[tuple[str, str, str, str]]:
    """(objective, target, measured, verdict) for every objective spec.slo sets. `percentiles` (seconds by
    objective, e.g. "ttft-p99", read from Prometheus) win over status.signals, which holds p95 only."""
    slo = spec.get("slo") or {}
    rows = []
    for metric in ("ttft", "tpot", "e2e"):
        for percentile, target in (slo.get(metric) or {}).items():
            target_s = _duration_or_none(target)
            if target_s is None:
                continue
            label = f"{metric.upper()} {percentile}"
            read = (percentiles or {}).get(f"{metric}-{percentile}")
            measured = format_duration(read) if read is not None else None
            if measured is None and percentile == "p95":
                measured = signals.get(MEASURED[metric])
            if measured is None and percentile != "p95" and percentiles is None:
                rows.append((label, target, "-", "not read (status has p95; add --prometheus)"))
                continue
            rows.append((label, target, measured or "-", _verdict(_duration_or_none(measured), target_s)))
    error_target = float(slo.get("errorRate", 0.01))
    measured_error = signals.get("errorRate")
    if measured_error is None:
        rows.append(("error rate", f"{error_target:.2%}", "-", "no data"))
    else:
        verdict = "ok" if float(measured_error) <= error_target else "MISSED"
        rows.append(("error rate", f"{error_target:.2%}", f"{float(measured_error):.2%}", verdict))
    return rows


def _table(rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def render(
    isvc: Mapping[str, Any],
    now: datetime | None = None,
    width: int = 100,
    burns: Mapping[str, Burn] | None = None,
    alerts: list[Mapping[str, str]] | None = None,
    percentiles: Mapping[str, float] | None = None,
) -> list[str]:
    """`burns`, `alerts` (the labels of firing burn-rate alerts) and `percentiles` come from Prometheus;
    None: not asked."""
    now = now or datetime.now(UTC)
    meta, spec, status = isvc.get("metadata") or {}, isvc.get("spec") or {}, isvc.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = conditions.get("Ready", {})
    lines = [
        f"InferenceService {meta.get('namespace')}/{meta.get('name')}"
        f"  model {spec.get('model', {}).get('name')}  generation {meta.get('generation')}"
        f" (observed {status.get('observedGeneration', '-')})",
        f"Ready {ready.get('status', 'Unknown')} ({ready.get('reason', '-')}): {ready.get('message', '')}",
    ]
    lines += _wrap(
        "Conditions:", [_condition(t, c) for t in CONDITION_ORDER if (c := conditions.get(t))], width
    )
    for type_ in ("Degraded", "Stalled"):
        if conditions.get(type_, {}).get("status") == "True":
            lines.append(f"{type_}: {conditions[type_].get('message', '')}")

    signals = status.get("signals") or {}
    slo = spec.get("slo") or {}
    lines += ["", f"SLO over {slo.get('window', '5m')} (read {_age(signals.get('time'), now)})"]
    rows = [("objective", "target", "measured", ""), *slo_rows(spec, signals, percentiles)]
    if burns:
        rows = [(*rows[0], "burn 1h / 5m")] + [(*row, _burn_cell(row[0], burns)) for row in rows[1:]]
    lines += _table(rows)
    if alerts is not None:
        firing = sorted(
            {
                f"{a.get('slo')} {a.get('severity')} ({a.get('burn_rate')}x over {a.get('long_window')})"
                for a in alerts
            }
        )
        lines += _wrap("Alerts firing:", firing or ["none"], width)

    scaling = spec.get("scaling") or {}
    pinned = f", pinned by spec.replicas={spec['replicas']}" if spec.get("replicas") is not None else ""
    lines += [
        "",
        f"Replicas: desired {status.get('desiredReplicas', '-')}  ready {status.get('readyReplicas', '-')}"
        f"  existing {status.get('replicas', '-')}  (min {scaling.get('minReplicas', 1)},"
        f" max {scaling.get('maxReplicas', 1)}{pinned})",
        "Signals: "
        + (
            "  ".join(
                f"{label} {signals[key]}"
                for key, label in (
                    ("queueTimeP95", "queue p95"),
                    ("oldestWaitingAge", "oldest wait"),
                    ("kvCacheUsage", "KV usage"),
                    ("waitingPerReplica", "waiting/replica"),
                )
                if signals.get(key) is not None
            )
            or "none read"
        ),
    ]
    decisions = status.get("scalingDecisions") or []
    lines.append(f"Scaling decisions (last {min(DECISIONS_SHOWN, len(decisions))} of {len(decisions)}):")
    for d in decisions[-DECISIONS_SHOWN:]:
        lines.append(
            f"  {_clock(d.get('time'))}  {d.get('fromReplicas')} -> {d.get('toReplicas')}  "
            f"{d.get('signal')} {d.get('value')} (target {d.get('target')}): {d.get('reason', '')}"
        )

    rollout = spec.get("rollout") or {}
    strategy = rollout.get("strategy", "RollingUpdate")
    steps = rollout.get("steps") or []
    progressing = conditions.get("Progressing", {})
    lines += ["", f"Rollout: {strategy}" + ("  PAUSED" if rollout.get("paused") else "")]
    if strategy == "Canary":
        step = status.get("canaryStep")
        where = f"step {step + 1}/{len(steps)}" if isinstance(step, int) and steps else "no step"
        lines[-1] += (
            f"  phase {status.get('rolloutPhase', '-')}  {where}  weight {status.get('canaryWeight') or 0}%"
        )
        lines.append(
            f"  stable {status.get('stableRevision') or '-'}  canary {status.get('canaryRevision') or '-'}"
        )
    else:
        lines[-1] += f"  stable {status.get('stableRevision') or '-'}"
    lines.append(f"  {progressing.get('reason', '-')}: {progressing.get('message', '')}")
    verdicts = status.get("rolloutDecisions") or []
    if verdicts:
        lines.append(f"Rollout verdicts (last {min(DECISIONS_SHOWN, len(verdicts))} of {len(verdicts)}):")
        for v in verdicts[-DECISIONS_SHOWN:]:
            lines.append(
                f"  {_clock(v.get('time'))}  step {v.get('step', 0) + 1} at {v.get('weight')}%  "
                f"{v.get('action')}  {v.get('revision')}: {v.get('reason', '')}"
            )
    return [_fit(line, width) for line in lines]


def _wrap(prefix: str, items: list[str], width: int) -> list[str]:
    """`prefix item item ...` over as many lines as it takes, breaking between items."""
    lines = [prefix]
    for item in items:
        if len(lines[-1]) + 1 + len(item) > width and lines[-1].strip():
            lines.append(" " * len(prefix))
        lines[-1] += " " + item
    return lines


def _condition(type_: str, c: Mapping[str, Any]) -> str:
    """Type=Status, with the reason where it says more than the status (Ready's is on its own line)."""
    shown = type_ == "Progressing" or (
        type_ in ("Degraded", "Stalled", "SLOMet") and c.get("status") != "False"
    )
    return f"{type_}={c.get('status')}" + (f"({c.get('reason')})" if shown else "")


def _burn_cell(objective: str, burns: Mapping[str, Burn]) -> str:
    key = "error-rate" if objective == "error rate" else objective.lower().replace(" ", "-")
    burn = burns.get(key)
    if burn is None:
        return "-"

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}x"

    return f"{fmt(burn.long)} / {fmt(burn.short)}"
