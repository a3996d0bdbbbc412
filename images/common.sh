# Shared by the image build scripts: where the per-machine image cache lives, the buildah storage the
# builds use (vfs, our own root: the machine's /var/lib/containers is left alone), and progress lines.
# Sourced, not run.
CACHE="${KUBEINFER_CACHE:-$HOME/.cache/kubeinfer}"
IMAGES="$CACHE/images"
BUILDAH_ROOT="$IMAGES/buildah"
BUILDAH=(buildah --root "$BUILDAH_ROOT/storage" --runroot "$BUILDAH_ROOT/run" --storage-driver "${KUBEINFER_BUILDAH_DRIVER:-overlay}")
mkdir -p "$IMAGES"

log() { printf '[images %4ds] %s\n' "$SECONDS" "$*" >&2; }

# A short hash of files and strings: the cache key of one image.
inputs_hash() {
  local item
  for item in "$@"; do
    if [[ -f "$item" ]]; then sha256sum "$item"; else printf '%s\n' "$item"; fi
  done | sha256sum | cut -c1-16
}
