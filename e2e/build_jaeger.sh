#!/usr/bin/env bash
# Build Jaeger (all-in-one: OTLP receivers on 4317/4318, in-memory storage, the query API on 16686) from
# the Go module proxy, once per machine, cached outside the repo and keyed by version.  The tracing
# tests (tests/tracing) send spans to it and read them back from its query API.  Idempotent: a built
# binary is reused as it is.  Prints the binary's path.
set -euo pipefail

JAEGER_VERSION="${JAEGER_VERSION:-v1.76.0}"
CACHE="${KUBEINFER_CACHE:-$HOME/.cache/kubeinfer}"
OUT="$CACHE/bin/jaeger-${JAEGER_VERSION}"
BIN="$OUT/jaeger"

if [[ -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi
mkdir -p "$OUT"
# one build at a time (parallel test sessions may all ask for it); a waiter finds it done
exec 9>"$OUT.lock"
flock 9
if [[ -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi
progress() { printf '[jaeger %s] %s (%ds elapsed)\n' "$JAEGER_VERSION" "$1" "$SECONDS" >&2; }

# A wrapper module: `go get -tool` resolves Jaeger's dependency graph at the versions its go.mod asks for,
# and -mod=mod lets the build fill go.sum as it goes.
src="$CACHE/src/jaeger-${JAEGER_VERSION}"
mkdir -p "$src"
cd "$src"
printf 'module kubeinfer.dev/jaeger-build\n\ngo 1.24\n' > go.mod
export CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false"
progress "resolving the module graph"
go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@${JAEGER_VERSION}" >/dev/null 2>get.log || { cat get.log >&2; exit 1; }
progress "building cmd/jaeger (several minutes on a small machine)"
nice -n 10 go build -trimpath -ldflags "-s -w" -o "$BIN.partial" github.com/jaegertracing/jaeger/cmd/jaeger
mv "$BIN.partial" "$BIN"
progress "done"
echo "$BIN"
