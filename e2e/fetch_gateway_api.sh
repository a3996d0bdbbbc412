#!/usr/bin/env bash
# The Gateway API CRDs (standard channel) from the Go module proxy, cached outside the repo by version;
# prints the directory holding them. Tests install HTTPRoute's to check the routes the operator writes.
set -euo pipefail

GATEWAY_API_VERSION="${GATEWAY_API_VERSION:-v1.3.0}"
CACHE="${KUBEINFER_CACHE:-$HOME/.cache/kubeinfer}"
OUT="$CACHE/gateway-api-${GATEWAY_API_VERSION}"

if [[ ! -f "$OUT/.complete" ]]; then
  mkdir -p "$OUT"
  # outside any module: `go mod download` then fetches just this module into the module cache
  dir=$(cd "$OUT" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/gateway-api@${GATEWAY_API_VERSION}" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  cp "$dir"/config/crd/standard/*.yaml "$OUT/"
  chmod u+w "$OUT"/*.yaml
  touch "$OUT/.complete"
fi
echo "$OUT"
