"""Prometheus (built from source with the Kubernetes binaries: Debian's package is built without the
Kubernetes service discovery), finding pods through the local apiserver (kubernetes_sd, role pod)
and scraping those annotated `prometheus.io/scrape: "true"` at their `prometheus.io/port` and
`prometheus.io/path`, with the pod's namespace, name and kubeinfer labels as target labels. Rule files
(`rules/*.yml` under its directory) are loaded at start and on POST /-/reload: tests put there what
Prometheus Operator would write from a PrometheusRule."""

from __future__ import annotations

from pathlib import Path

import yaml

SCRAPE_INTERVAL = "2s"  # tests wait on fresh samples; a real cluster would scrape every 15-30 s
POD_LABEL_TARGETS = {
    "serving.kubeinfer.dev/inferenceservice": "inferenceservice",
    "serving.kubeinfer.dev/revision": "revision",
    "serving.kubeinfer.dev/track": "track",
}


def _sanitize(label: str) -> str:
    """Pod label name -> its __meta_kubernetes_pod_label_* suffix (non-alphanumerics become `_`)."""
    return "".join(c if c.isalnum() else "_" for c in label)


def scrape_config(kubeconfig: Path) -> dict[str, object]:
    relabel: list[dict[str, object]] = [
        {
            "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
            "regex": "true",
            "action": "keep",
        },
        {
            "source_labels": ["__meta_kubernetes_pod_phase"],
            "regex": "Pending|Succeeded|Failed",
            "action": "drop",
        },
        {
            "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
            "regex": "(.+)",
            "target_label": "__metrics_path__",
        },
        {
            "source_labels": ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
            "regex": r"([^:]+)(?::\d+)?;(\d+)",
            "replacement": "$1:$2",
            "target_label": "__address__",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    ]
    relabel += [
        {"source_labels": [f"__meta_kubernetes_pod_label_{_sanitize(label)}"], "target_label": target}
        for label, target in POD_LABEL_TARGETS.items()
    ]
    return {
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "evaluation_interval": SCRAPE_INTERVAL,
            "scrape_timeout": SCRAPE_INTERVAL,
        },
        "scrape_configs": [
            {
                "job_name": "kubernetes-pods",
                "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": str(kubeconfig)}],
                "relabel_configs": relabel,
            }
        ],
    }


def rules_dir(prom_dir: Path) -> Path:
    return prom_dir / "rules"


def write_config(prom_dir: Path, kubeconfig: Path) -> Path:
    prom_dir.mkdir(parents=True, exist_ok=True)
    rules_dir(prom_dir).mkdir(exist_ok=True)
    path = prom_dir / "prometheus.yml"
    config = {**scrape_config(kubeconfig), "rule_files": [str(rules_dir(prom_dir) / "*.yml")]}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def argv(bin_dir: Path, prom_dir: Path, address: str, port: int) -> list[str]:
    return [
        str(bin_dir / "prometheus"),
        f"--config.file={prom_dir / 'prometheus.yml'}",
        f"--storage.tsdb.path={prom_dir / 'data'}",
        f"--web.listen-address={address}:{port}",
        "--web.enable-lifecycle",
        "--storage.tsdb.retention.time=1d",
        "--log.level=warn",
    ]


# Where the chart's default `prometheusUrl` (http://prometheus-server.monitoring.svc:9090, the
# prometheus-community chart's Service) points: a Service without a selector whose one endpoint is the
# host's Prometheus, so pods reach it by that DNS name as they would a Prometheus running in the cluster.
SERVICE_NAMESPACE, SERVICE_NAME, SERVICE_PORT = "monitoring", "prometheus-server", 9090


def service_manifests(ip: str, port: int) -> list[dict[str, object]]:
    meta = {"name": SERVICE_NAME, "namespace": SERVICE_NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SERVICE_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {
                "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": port, "protocol": "TCP"}]
            },
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": SERVICE_NAME,
                "namespace": SERVICE_NAMESPACE,
                "labels": {"kubernetes.io/service-name": SERVICE_NAME},
            },
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
        },
    ]
