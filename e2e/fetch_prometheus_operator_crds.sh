#!/usr/bin/env bash
# The Prometheus Operator CRDs (PodMonitor, ServiceMonitor, PrometheusRule, ...) from the Go module proxy,
# cached outside the repo by version; prints the directory holding them. Tests install them to check that
# the objects the chart and the operator write are what the real schemas accept.
set -euo pipefail
exec bash "$(dirname "$0")/fetch_module_files.sh" github.com/prometheus-operator/prometheus-operator \
  "${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}" example/prometheus-operator-crd prometheus-operator-crds
