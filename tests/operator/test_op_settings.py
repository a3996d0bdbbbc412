"""Operator settings from the environment the chart sets."""

from __future__ import annotations

import pytest

from kubeinfer_operator.settings import load_settings


def test_chart_environment_is_read() -> None:
    settings = load_settings(
        {
            "KUBEINFER_NAMESPACES": "llm, team-a",
            "KUBEINFER_PROMETHEUS_URL": "http://prom:9090",
            "KUBEINFER_LOG_LEVEL": "debug",
            "KUBEINFER_LEADER_ELECTION": "false",
            "POD_NAMESPACE": "kubeinfer-system",
            "POD_NAME": "kubeinfer-operator-abc",
        }
    )
    assert settings.namespaces == ("llm", "team-a")
    assert settings.prometheus_url == "http://prom:9090"
    assert settings.log_level == "DEBUG"
    assert settings.leader_election is False
    assert settings.lease_namespace == "kubeinfer-system"
    assert settings.identity.startswith("kubeinfer-operator-abc_")


def test_monitoring_settings_are_read() -> None:
    settings = load_settings(
        {
            "KUBEINFER_SLO_ALERTS": "false",
            "KUBEINFER_SCRAPE_ANNOTATIONS": "false",
            "KUBEINFER_MONITORING_LABELS": '{"release": "kps", "team": "llm"}',
            "KUBEINFER_METRICS_PORT": "8081",
        }
    )
    assert (settings.slo_alerts, settings.scrape_annotations, settings.metrics_port) == (False, False, 8081)
    assert settings.monitoring_labels == (("release", "kps"), ("team", "llm"))
    defaults = load_settings({})
    assert (defaults.slo_alerts, defaults.scrape_annotations, defaults.monitoring_labels) == (True, True, ())


def test_two_processes_of_one_pod_never_share_an_identity() -> None:
    env = {"POD_NAME": "same"}
    assert load_settings(env).identity != load_settings(env).identity


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"KUBEINFER_LOG_LEVEL": "loud"}, "KUBEINFER_LOG_LEVEL"),
        ({"KUBEINFER_LEADER_ELECTION": "maybe"}, "KUBEINFER_LEADER_ELECTION"),
        ({"KUBEINFER_RESYNC_SECONDS": "0"}, "KUBEINFER_RESYNC_SECONDS"),
        ({"KUBEINFER_MONITORING_LABELS": "release=x"}, "KUBEINFER_MONITORING_LABELS"),
        ({"KUBEINFER_MONITORING_LABELS": '{"n": 1}'}, "KUBEINFER_MONITORING_LABELS"),
        ({"KUBEINFER_METRICS_PORT": "http"}, "KUBEINFER_METRICS_PORT"),
        ({"KUBEINFER_SLO_ALERTS": "perhaps"}, "KUBEINFER_SLO_ALERTS"),
    ],
)
def test_bad_values_name_their_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        load_settings(env)


def test_the_url_probe_is_on_in_a_pod_and_off_outside_unless_set() -> None:
    assert load_settings({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}).probe_service_url is True
    assert load_settings({}).probe_service_url is False  # a developer's `kopf run` cannot reach Services
    assert (
        load_settings(
            {"KUBERNETES_SERVICE_HOST": "x", "KUBEINFER_PROBE_SERVICE_URL": "false"}
        ).probe_service_url
        is False
    )
