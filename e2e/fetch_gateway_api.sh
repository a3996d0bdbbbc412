#!/usr/bin/env bash
# The Gateway API CRDs (standard channel) from the Go module proxy, cached outside the repo by version;
# prints the directory holding them. Tests install HTTPRoute's to check the routes the operator writes.
set -euo pipefail
exec bash "$(dirname "$0")/fetch_module_files.sh" sigs.k8s.io/gateway-api "${GATEWAY_API_VERSION:-v1.3.0}" \
  config/crd/standard gateway-api
