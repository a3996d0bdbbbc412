#!/usr/bin/env bash
# fetch_module_files.sh MODULE VERSION SUBDIR NAME: the *.yaml files of SUBDIR of a Go module, from the Go
# module proxy, copied to $CACHE/NAME-VERSION once (a .complete stamp marks it done); prints that directory.
# What the CRD fetchers (fetch_gateway_api.sh, fetch_prometheus_operator_crds.sh) share.
set -euo pipefail

module="$1" version="$2" subdir="$3" name="$4"
CACHE="${KUBEINFER_CACHE:-$HOME/.cache/kubeinfer}"
OUT="$CACHE/${name}-${version}"

if [[ ! -f "$OUT/.complete" ]]; then
  mkdir -p "$OUT"
  # outside any module: `go mod download` then fetches just this module into the module cache
  dir=$(cd "$OUT" && GOFLAGS=-mod=mod go mod download -json "${module}@${version}" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  cp "$dir/$subdir"/*.yaml "$OUT/"
  chmod u+w "$OUT"/*.yaml
  touch "$OUT/.complete"
fi
echo "$OUT"
