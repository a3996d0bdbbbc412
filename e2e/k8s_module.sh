# Sourced by build_binaries.sh and build_node_binaries.sh: their version-keyed cache directory, and a
# wrapper Go module that builds commands of k8s.io/kubernetes from the Go module proxy.  k8s.io/kubernetes's go.mod points each staging module at
# ./staging, which a module download lacks; the wrapper replaces each with its published v0.x version.

# k8s_wrapper_module VERSION: write go.mod for VERSION into the current directory.
k8s_wrapper_module() {
  local version=$1 upstream_mod staging_ver
  upstream_mod=$(go mod download -json "k8s.io/kubernetes@${version}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  staging_ver="v0.${version#v1.}"
  {
    echo "module kubeinfer.dev/k8s-build"
    echo
    grep -E '^go [0-9]' "$upstream_mod"
    grep -E '^godebug ' "$upstream_mod" || true
    echo
    echo "require k8s.io/kubernetes ${version}"
    echo
    echo "replace ("
    grep -E '^\s+k8s.io/[a-z0-9-]+ => ./staging/' "$upstream_mod" | awk -v v="$staging_ver" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } > go.mod
}

# k8s_ldflags VERSION: the -X flags that make `--version` report VERSION, as a release build does.
k8s_ldflags() {
  local version=$1 ldflags="-s -w" key k v
  for key in gitVersion:${version} gitMajor:1 gitMinor:$(echo "$version" | cut -d. -f2) gitTreeState:clean buildDate:$(date -u +%Y-%m-%dT%H:%M:%SZ); do
    k=${key%%:*}; v=${key#*:}
    ldflags+=" -X k8s.io/client-go/pkg/version.$k=$v -X k8s.io/component-base/version.$k=$v"
  done
  echo "$ldflags"
}

# reuse_or_lock OUT: a finished OUT (its .complete stamp) is printed and the script ends; otherwise the
# script holds OUT.lock from here on (parallel test sessions may all ask; a waiter then finds it done).
reuse_or_lock() {
  local out=$1
  if [[ -f "$out/.complete" ]]; then
    echo "$out"
    exit 0
  fi
  mkdir -p "$out"
  exec 9>"$out.lock"
  flock 9
  if [[ -f "$out/.complete" ]]; then
    echo "$out"
    exit 0
  fi
}
