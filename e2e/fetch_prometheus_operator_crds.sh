#!/usr/bin/env bash
# The Prometheus Operator CRDs (PodMonitor, ServiceMonitor, PrometheusRule, ...) from the Go module proxy,
# cached outside the repo by version; prints the directory holding them. Tests install them to check that
# the objects the chart and the operator write are what the real schemas accept.
set -euo pipefail

PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
CACHE="${KUBEINFER_CACHE:-$HOME/.cache/kubeinfer}"
OUT="$CACHE/prometheus-operator-crds-${PROMETHEUS_OPERATOR_VERSION}"

if [[ ! -f "$OUT/.complete" ]]; then
  mkdir -p "$OUT"
  # outside any module: `go mod download` then fetches just this module into the module cache
  dir=$(cd "$OUT" && GOFLAGS=-mod=mod go mod download -json \
    "github.com/prometheus-operator/prometheus-operator@${PROMETHEUS_OPERATOR_VERSION}" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  cp "$dir"/example/prometheus-operator-crd/*.yaml "$OUT/"
  chmod u+w "$OUT"/*.yaml
  touch "$OUT/.complete"
fi
echo "$OUT"
