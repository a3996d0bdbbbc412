#!/usr/bin/env bash
# Debian packages the local cluster needs: the tools that make pod network namespaces and mount
# namespaces, containerd/runc/CNI/buildah for real nodes, iptables/conntrack for kube-proxy, and a C++ toolchain for the engine's CPU kernels.  Idempotent: apt-get runs only when a command is
# missing.  (Prometheus is built from source by build_binaries.sh: Debian's package lacks the Kubernetes
# service discovery.)
set -euo pipefail

# command -> package that provides it
declare -A NEEDS=(
  [ip]=iproute2
  [iptables]=iptables
  [ip6tables]=iptables
  [conntrack]=conntrack
  [nsenter]=util-linux
  [unshare]=util-linux
  [setsid]=util-linux
  [mount]=mount
  [openssl]=openssl
  [ps]=procps
  [g++]=g++  # the engine's CPU kernels are compiled on first use (models/fused_ops.py)
  [ninja]=ninja-build
  # real nodes (KUBEINFER_NODE_KIND=real): the container runtime, CNI plugins, the daemonless image
  # builder and the base image's debootstrap; gcc links the static pause binary
  [containerd]=containerd
  [ctr]=containerd
  [runc]=runc
  [/usr/lib/cni/bridge]=containernetworking-plugins
  [/usr/lib/cni/host-local]=containernetworking-plugins
  [buildah]=buildah
  [debootstrap]=debootstrap
  [gcc]=gcc
  [tar]=tar
)
missing=()
for cmd in "${!NEEDS[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || [[ -x "$cmd" ]] || missing+=("${NEEDS[$cmd]}")
done
if ((${#missing[@]} == 0)); then
  echo "install_deps: all present"
  exit 0
fi
mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
echo "install_deps: installing ${packages[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
echo "install_deps: done"
