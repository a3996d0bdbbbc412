#!/usr/bin/env bash
# The base image that stands in for `python:3.11-slim` where no public image registry is reachable:
# Debian bookworm (minbase) from the machine's configured apt mirror, with Python 3.11, pip and the
# CA certificates, set up as the official image is (python/pip on PATH, pip may install into the system,
# LANG=C.UTF-8).  Cached per machine, keyed by the hash of this script, the suite and the mirror; the
# committed image lives in the harness's buildah storage.  Prints the image name.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/common.sh"

SUITE="${KUBEINFER_BASE_SUITE:-bookworm}"
# the first Debian URI apt is configured with (deb822 .sources or a one-line sources.list)
MIRROR="${KUBEINFER_DEBIAN_MIRROR:-$(grep -hoE '(URIs: |^deb )[^ ]+' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | grep -v security | head -1 | awk '{print $2}' || true)}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
PACKAGES=python3,python3-pip,python3-venv,ca-certificates,netbase
key=$(inputs_hash "$here/build_base.sh" "$SUITE" "$MIRROR" "$PACKAGES")
NAME="localhost/kubeinfer/python:3.11-slim-${SUITE}-${key}"
rootfs_tar="$IMAGES/base-${SUITE}-${key}.tar"

if "${BUILDAH[@]}" inspect --type image "$NAME" >/dev/null 2>&1; then
  echo "$NAME"
  exit 0
fi
exec 9>"$IMAGES/base.lock"
flock 9
if [[ ! -f "$rootfs_tar" ]]; then
  log "debootstrap $SUITE (minbase + $PACKAGES) from $MIRROR"
  work=$(mktemp -d "$IMAGES/debootstrap.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$work/rootfs" "$MIRROR" >"$work/log" 2>&1 \
    || { tail -20 "$work/log" >&2; exit 1; }
  r="$work/rootfs"
  # as the official python image: pip installs into the system (no PEP 668 marker), python/pip on PATH
  rm -f "$r"/usr/lib/python3*/EXTERNALLY-MANAGED
  ln -sf /usr/bin/python3 "$r/usr/local/bin/python"
  ln -sf /usr/bin/pip3 "$r/usr/local/bin/pip"
  # an image carries no package lists, caches or logs of how it was made
  rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/cache/apt/archives/*.deb \
    "$r"/var/log/* "$r"/tmp/* "$r"/root/.cache
  tar -C "$r" --numeric-owner -cf "$rootfs_tar.tmp" .
  mv "$rootfs_tar.tmp" "$rootfs_tar"
  log "rootfs $(du -h "$rootfs_tar" | cut -f1)"
fi
log "committing $NAME"
ctr=$("${BUILDAH[@]}" from scratch)
"${BUILDAH[@]}" add "$ctr" "$rootfs_tar" / >/dev/null
"${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env LANG=C.UTF-8 --cmd python3 --os linux --arch amd64 "$ctr"
"${BUILDAH[@]}" commit --quiet --rm "$ctr" "$NAME" >/dev/null
echo "$NAME"
