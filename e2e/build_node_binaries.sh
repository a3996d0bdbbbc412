#!/usr/bin/env bash
# Build what a real node needs beyond Debian's containerd, runc and CNI plugins: the kubelet (same
# Kubernetes version as the control plane, from the same wrapper module), crictl, CoreDNS (run in the
# cluster as the kube-dns Deployment) and the fake GPU device plugin (e2e/deviceplugin).  Once per
# machine, cached outside the repo, keyed by the versions and the device plugin's source hash.
# Idempotent; prints the binary directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/k8s_module.sh"

K8S_VERSION="${K8S_VERSION:-v1.34.4}"         # keep in step with build_binaries.sh
CRICTL_VERSION="${CRICTL_VERSION:-v1.34.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.12.1}" # what kubeadm deploys with Kubernetes 1.34
CACHE="${KUBEINFER_CACHE:-$HOME/.cache/kubeinfer}"
dp_hash=$(cat "$here"/deviceplugin/go.mod "$here"/deviceplugin/go.sum "$here"/deviceplugin/*.go | sha256sum | cut -c1-12)
OUT="$CACHE/node-bin/k8s-${K8S_VERSION}_crictl-${CRICTL_VERSION}_coredns-${COREDNS_VERSION}_dp-${dp_hash}"

reuse_or_lock "$OUT"  # prints $OUT and exits when that version is already built
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
total=4
step=0
progress() {  # [2/4 ##..] building crictl v1.34.0 (93s elapsed)
  local bar
  bar=$(printf '%*s' "$step" '' | tr ' ' '#')$(printf '%*s' "$((total - step))" '' | tr ' ' '.')
  printf '[%d/%d %s] %s (%ds elapsed)\n' "$step" "$total" "$bar" "$1" "$SECONDS" >&2
}
timed() {  # timed NAME CMD...: run, and record the build's seconds in build-times.txt
  local began=$SECONDS
  "${@:2}"
  echo "$1 $((SECONDS - began))s" >> "$OUT/build-times.txt"
  step=$((step + 1))
}

# --- kubelet: its own copy of the wrapper module (the control plane's stays as it is); it needs two
# modules the other commands do not.
progress "building kubelet ${K8S_VERSION}"
src="$CACHE/src/kubelet-${K8S_VERSION}"
mkdir -p "$src"
cd "$src"
k8s_wrapper_module "$K8S_VERSION"
printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kubelet"\n' > tools.go
go mod tidy -e >/dev/null 2>tidy.log || { cat tidy.log >&2; exit 1; }
timed kubelet go build -tags selinux,notest -trimpath -ldflags "$(k8s_ldflags "$K8S_VERSION")" \
  -o "$OUT/kubelet" k8s.io/kubernetes/cmd/kubelet

progress "building the fake device plugin"
cd "$here/deviceplugin"
timed fake-device-plugin go build -trimpath -ldflags "-s -w" -o "$OUT/fake-device-plugin" .

progress "building crictl ${CRICTL_VERSION}"
timed crictl env GOBIN="$OUT" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/cri-tools/cmd/crictl@${CRICTL_VERSION}"

progress "building coredns ${COREDNS_VERSION}"
timed coredns env GOBIN="$OUT" go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@${COREDNS_VERSION}"

progress "done"
touch "$OUT/.complete"
echo "$OUT"
