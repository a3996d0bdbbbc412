#!/usr/bin/env bash
# kstatus-check (e2e/kstatus/main.go) built against sigs.k8s.io/cli-utils from the Go module proxy, cached
# outside the repo by version; prints the binary's path. The tests ask kstatus itself, the library Flux's
# health checks use, what it makes of the InferenceService status the operator writes.
set -euo pipefail

CLI_UTILS_VERSION="${CLI_UTILS_VERSION:-v0.37.2}"
CACHE="${KUBEINFER_CACHE:-$HOME/.cache/kubeinfer}"
OUT="$CACHE/kstatus-${CLI_UTILS_VERSION}"
here="$(cd "$(dirname "$0")" && pwd)"

if [[ ! -x "$OUT/kstatus-check" ]] || ! cmp -s "$here/kstatus/main.go" "$OUT/src/main.go"; then
  mkdir -p "$OUT/src"
  exec 9>"$OUT.lock"
  flock 9
  cp "$here/kstatus/main.go" "$OUT/src/main.go"
  cd "$OUT/src"
  printf 'module kubeinfer.dev/kstatus-check\n\ngo 1.24\n' > go.mod
  {
    go get "sigs.k8s.io/cli-utils@${CLI_UTILS_VERSION}" && go mod tidy
  } >/dev/null 2>get.log || { cat get.log >&2; exit 1; }
  CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags "-s -w" -o "$OUT/kstatus-check.partial" .
  mv "$OUT/kstatus-check.partial" "$OUT/kstatus-check"
fi
echo "$OUT/kstatus-check"
