#!/usr/bin/env bash
# Build the real Kubernetes control plane, kube-proxy, etcd, Prometheus (and promtool) and helm from the Go module proxy,
# once per machine, cached outside the repo and keyed by version.  Idempotent: a finished
# version directory (with its .complete stamp) is reused as it is.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/k8s_module.sh"

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v3.19.0}"
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v3.9.1}"
CACHE="${KUBEINFER_CACHE:-$HOME/.cache/kubeinfer}"
OUT="$CACHE/bin/k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}_prometheus-${PROMETHEUS_VERSION}"
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy)
IFS=. read -r pmajor pminor ppatch <<<"${PROMETHEUS_VERSION#v}"
prom_module="v0.$((pmajor * 100 + pminor)).${ppatch}"  # release v3.M.P is module version v0.(300+M).P

# promtool (checks and unit-tests the SLO alert rules) joined the set later than the .complete stamp: it
# has its own guard, so a cache completed before it existed still gets it. Same wrapper module as
# Prometheus (its go.mod has exclude directives), same version.
build_promtool() {
  [[ -x "$OUT/promtool" ]] && return 0
  echo "building promtool ${PROMETHEUS_VERSION}" >&2
  local tsrc="$CACHE/src/promtool-${PROMETHEUS_VERSION}"
  mkdir -p "$tsrc"
  (
    cd "$tsrc"
    printf 'module kubeinfer.dev/promtool-build\n\ngo 1.24\n' > go.mod
    go get "github.com/prometheus/prometheus/cmd/promtool@${prom_module}" >/dev/null 2>get.log || { cat get.log >&2; exit 1; }
    CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath \
      -ldflags "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v}" \
      -o "$OUT/promtool.partial" github.com/prometheus/prometheus/cmd/promtool
    mv "$OUT/promtool.partial" "$OUT/promtool"
  )
}

if [[ -f "$OUT/.complete" && -x "$OUT/promtool" ]]; then
  echo "$OUT"
  exit 0
fi
mkdir -p "$OUT"
# one build at a time (parallel test sessions may all ask for the binaries); a waiter finds it done
exec 9>"$OUT.lock"
flock 9
if [[ -f "$OUT/.complete" ]]; then
  build_promtool
  echo "$OUT"
  exit 0
fi
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
total=$(( ${#COMPONENTS[@]} + 3 ))  # promtool rides on the last step
step=0
progress() {  # a one-line progress display on stderr: [3/6 ####......] building kube-proxy (412s)
  local bar
  bar=$(printf '%*s' "$step" '' | tr ' ' '#')$(printf '%*s' "$((total - step))" '' | tr ' ' '.')
  printf '[%d/%d %s] %s (%ds elapsed)\n' "$step" "$total" "$bar" "$1" "$SECONDS" >&2
}

# --- Kubernetes, from a wrapper module (k8s_module.sh)
src="$CACHE/src/kubernetes-${K8S_VERSION}"
mkdir -p "$src"
cd "$src"
k8s_wrapper_module "$K8S_VERSION"
cat > tools.go <<GO
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
progress "resolving Kubernetes ${K8S_VERSION} module graph"
go mod tidy -e >/dev/null 2>tidy.log || { cat tidy.log >&2; exit 1; }
ldflags=$(k8s_ldflags "$K8S_VERSION")
for c in "${COMPONENTS[@]}"; do
  progress "building $c"
  go build -tags selinux,notest -trimpath -ldflags "$ldflags" -o "$OUT/$c" "k8s.io/kubernetes/cmd/$c"
  step=$((step + 1))
done

# --- etcd: server/v3's go.mod has replace directives (to its sibling modules), which `go install
# module@version` refuses; a wrapper module resolves those siblings at their published versions.
progress "building etcd ${ETCD_VERSION}"
esrc="$CACHE/src/etcd-${ETCD_VERSION}"
mkdir -p "$esrc"
cd "$esrc"
printf 'module kubeinfer.dev/etcd-build\n\ngo 1.24\n' > go.mod
go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" >/dev/null 2>get.log || { cat get.log >&2; exit 1; }
go build -trimpath -ldflags "-s -w" -o "$OUT/etcd" go.etcd.io/etcd/server/v3
step=$((step + 1))
# --- Prometheus: Debian's package is built without Kubernetes service discovery.  Its go.mod has exclude
# directives, so it too gets a wrapper module.  Release v3.M.P is module version v0.(300+M).P.  No web UI
# assets (they come from an npm build); the API and everything the tests use are there.
progress "building prometheus ${PROMETHEUS_VERSION}"
psrc="$CACHE/src/prometheus-${PROMETHEUS_VERSION}"
mkdir -p "$psrc"
cd "$psrc"
printf 'module kubeinfer.dev/prometheus-build\n\ngo 1.24\n' > go.mod
go get "github.com/prometheus/prometheus/cmd/prometheus@${prom_module}" >/dev/null 2>get.log || { cat get.log >&2; exit 1; }
go build -trimpath -ldflags "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v}" \
  -o "$OUT/prometheus" github.com/prometheus/prometheus/cmd/prometheus
step=$((step + 1))
progress "building helm ${HELM_VERSION}"
GOBIN="$OUT" go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
step=$((step + 1))
progress "building promtool ${PROMETHEUS_VERSION}"
build_promtool
progress "done"
touch "$OUT/.complete"
echo "$OUT"
