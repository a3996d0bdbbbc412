#!/usr/bin/env bash
# Build the cluster's images without a Docker daemon (buildah, chroot isolation) and export each to an
# OCI layout under ~/.cache/kubeinfer/images/oci/.  Usage:  images/build.sh IMAGE...  where IMAGE is
#   pause     the pod sandbox (images/pause/pause.c, static)            -> localhost/kubeinfer/pause:3.10
#   coredns   cluster DNS, from build_node_binaries.sh's CoreDNS         -> localhost/kubeinfer/coredns:<version>
#   operator  operator/Dockerfile on the local Debian base               -> ghcr.io/kubeinfer/operator:<appVersion>
#   runtime   runtime_image/Dockerfile on the local Debian base          -> ghcr.io/kubeinfer/runtime:<appVersion>
# The operator and runtime names are the chart's defaults, so pods run what the chart renders.
# Each image is cached by a hash of its inputs: an unchanged one is not built again.  Prints one line
# per image:  <reference> <OCI layout dir> <manifest digest>.  Build times and sizes go to stderr.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
source "$here/common.sh"
APP_VERSION=$(awk -F'"' '/^appVersion:/ {print $2}' "$repo/charts/kubeinfer/Chart.yaml")
HOST_CA="${KUBEINFER_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}"
mkdir -p "$IMAGES/oci" "$IMAGES/stamps"
exec 8>"$IMAGES/build.lock"
flock 8
# Builds are serialized by the lock above: a working container left now is a failed build's.  At the
# end the storage's mounts go too (the overlay driver keeps its home bind-mounted while in use).
"${BUILDAH[@]}" rm --all >/dev/null
cleanup_storage() {
  "${BUILDAH[@]}" rm --all >/dev/null 2>&1 || true
  if mountpoint -q "$BUILDAH_ROOT/storage/overlay"; then umount "$BUILDAH_ROOT/storage/overlay" || true; fi
}
trap cleanup_storage EXIT

# Files under the given paths that are part of the build context (.dockerignore's patterns aside).
context_files() {
  (cd "$repo" && find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' | LC_ALL=C sort)
}

# cached KEY: print the stamp of KEY if its image is still what the OCI layout holds under its name
cached() {
  local stamp="$IMAGES/stamps/$1" ref layout digest
  [[ -f "$stamp" ]] || return 1
  read -r ref layout digest < "$stamp"
  [[ "$(layout_digest "$layout" "$ref")" == "$digest" ]] || return 1
  cat "$stamp"
}

layout_digest() {  # layout_digest DIR REF: the manifest digest DIR's index names REF
  python3 -c 'import json,sys; idx=json.load(open(sys.argv[1]+"/index.json")); print(next((m["digest"] for m in idx["manifests"] if m.get("annotations",{}).get("org.opencontainers.image.ref.name")==sys.argv[2]), ""))' "$1" "$2" 2>/dev/null || true
}

# prune_layout DIR: drop the index entries a push left without a name (earlier builds of the image) and
# the blobs no named manifest reaches: ~2 GB per rebuild of the runtime image otherwise.
prune_layout() {
  python3 - "$1" <<'PY'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
def blob(digest): return root / "blobs" / digest.replace(":", "/", 1)
index = json.loads((root / "index.json").read_text())
index["manifests"] = [m for m in index["manifests"] if "org.opencontainers.image.ref.name" in m.get("annotations", {})]
(root / "index.json").write_text(json.dumps(index))
keep, todo = set(), [m["digest"] for m in index["manifests"]]
while todo:  # manifests (and nested indexes) name their config and layers
    digest = todo.pop()
    keep.add(digest)
    doc = json.loads(blob(digest).read_text())
    todo += [d["digest"] for d in doc.get("manifests", [])]
    keep.update(d["digest"] for d in [doc.get("config") or {}, *doc.get("layers", [])] if d)
for path in (root / "blobs").glob("*/*"):
    if f"{path.parent.name}:{path.name}" not in keep:
        path.unlink()
PY
}

# export_image REF KEY: push REF from buildah storage to its OCI layout (reusing blobs already there),
# record the key, print the result line.
export_image() {
  local ref=$1 key=$2 layout digest id
  layout="$IMAGES/oci/$(echo "${ref%:*}" | tr '/' '_')"
  id=$("${BUILDAH[@]}" images --noheading --no-trunc --format '{{.ID}}' "$ref" | head -1)
  # an unchanged image (same ID: every layer cached) is not pushed again; pushing compresses each layer
  if [[ "$(cat "$layout/.image-id" 2>/dev/null)" != "$id" ]]; then
    local began=$SECONDS
    "${BUILDAH[@]}" push --quiet "$ref" "oci:$layout:$ref" >/dev/null
    prune_layout "$layout"
    echo "$id" > "$layout/.image-id"
    log "exported $ref in $((SECONDS - began))s, $(du -sh "$layout" | cut -f1) compressed"
  fi
  digest=$(layout_digest "$layout" "$ref")
  echo "$ref $layout $digest" > "$IMAGES/stamps/$key"
  cat "$IMAGES/stamps/$key"
}

report() {  # report REF SECONDS
  local size
  size=$("${BUILDAH[@]}" images --format '{{.Size}}' "$1" 2>/dev/null | head -1)
  log "built $1 in ${2}s, $size"
}

build_pause() {
  local ref=localhost/kubeinfer/pause:3.10 key work ctr began=$SECONDS
  key=pause-$(inputs_hash "$here/build.sh" "$here/pause/pause.c")
  cached "$key" && return
  work=$(mktemp -d)
  gcc -Os -static -o "$work/pause" "$here/pause/pause.c"
  ctr=$("${BUILDAH[@]}" from scratch)
  "${BUILDAH[@]}" copy --quiet "$ctr" "$work/pause" /pause >/dev/null
  "${BUILDAH[@]}" config --entrypoint '["/pause"]' --env PATH=/ --user 65535:65535 --os linux --arch amd64 "$ctr"
  "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$ref" >/dev/null
  rm -rf "$work"
  report "$ref" $((SECONDS - began))
  export_image "$ref" "$key"
}

build_coredns() {
  local bin key ctr version ref began=$SECONDS
  bin="$(bash "$repo/e2e/build_node_binaries.sh")/coredns"
  version=$(basename "$(dirname "$bin")" | grep -oE 'coredns-v[0-9.]+' | cut -d- -f2)
  ref="localhost/kubeinfer/coredns:$version"
  key=coredns-$(inputs_hash "$here/build.sh" "$bin")
  cached "$key" && return
  ctr=$("${BUILDAH[@]}" from scratch)
  "${BUILDAH[@]}" copy --quiet "$ctr" "$bin" /coredns >/dev/null
  # as the upstream image: a static binary, non-root (port 53 needs NET_BIND_SERVICE from the pod spec)
  "${BUILDAH[@]}" config --entrypoint '["/coredns"]' --user 65532:65532 --port 53/udp --port 53/tcp \
    --os linux --arch amd64 "$ctr"
  "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$ref" >/dev/null
  report "$ref" $((SECONDS - began))
  export_image "$ref" "$key"
}

# build_dockerfile NAME DOCKERFILE PATHS...: `buildah bud` of a repo Dockerfile on the local base, the
# host's CA bundle mounted for the build's pip and apt (registry traffic passes an intercepting proxy),
# not copied into the image.
build_dockerfile() {
  local name=$1 dockerfile=$2 ref base key began=$SECONDS
  shift 2
  ref="ghcr.io/kubeinfer/$name:$APP_VERSION"
  base=$(bash "$here/build_base.sh")
  key=$name-$(inputs_hash "$here/build.sh" "$base" "$dockerfile" $(context_files "$@"))
  cached "$key" && return
  log "building $ref from ${dockerfile#"$repo"/} on $base"
  "${BUILDAH[@]}" bud --quiet --layers --isolation chroot --network host \
    --build-arg "BASE_IMAGE=$base" --volume "$HOST_CA:/etc/ssl/certs/ca-certificates.crt:ro" \
    -f "$dockerfile" -t "$ref" "$repo" >&2
  report "$ref" $((SECONDS - began))
  export_image "$ref" "$key"
}

for image in "$@"; do
  case "$image" in
    pause) build_pause ;;
    coredns) build_coredns ;;
    operator) build_dockerfile operator "$repo/operator/Dockerfile" pyproject.toml README.md operator ;;
    runtime) build_dockerfile runtime "$repo/runtime_image/Dockerfile" pyproject.toml README.md operator/kubeinfer_operator runtime_image ;;
    *) echo "unknown image: $image (pause, coredns, operator, runtime)" >&2; exit 2 ;;
  esac
done
