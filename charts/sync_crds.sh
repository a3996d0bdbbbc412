#!/usr/bin/env bash
# Copy the generated CRDs (crds/, the one source) into the chart, which Helm installs before its
# templates. tests/operator/test_op_chart.py fails when the copies differ.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/charts/kubeinfer/crds"
mkdir -p "$dest"
rm -f "$dest"/*.yaml
cp "$root"/crds/*.yaml "$dest"/
