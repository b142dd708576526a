# Sourced by the build scripts of cached Go components (hack/kueue, hack/registry, hack/gangschedulers, hack/helmtools).
#   cached_build NAME OUT "$@"
# answers --path (prints OUT), returns early (exit 0) when OUT is complete (marked by OUT/.complete), and otherwise
# takes OUT's lock (one build at a time across parallel test sessions) and returns to the caller, which builds and
# then writes OUT/.complete.
cached_build() {
  local name=$1 out=$2
  shift 2
  if [[ "${1:-}" == "--path" ]]; then echo "$out"; exit 0; fi
  if [[ -f "$out/.complete" ]]; then echo "$name: $out (cached)"; exit 0; fi
  command -v go >/dev/null || { echo "$name/build.sh: the go toolchain is required" >&2; exit 1; }
  mkdir -p "$(dirname "$out")"
  exec 9>"$out.lock"
  flock 9
  if [[ -f "$out/.complete" ]]; then echo "$name: $out (built by another process)"; exit 0; fi
}

# go_tool NAME MODULE VERSION PACKAGE BIN WORK [LDFLAGS] [TAGS]
# builds the main package PACKAGE of MODULE at VERSION into BIN/NAME, in WORK, a throwaway module of its own (so Go's
# minimal version selection never mixes two tools' dependencies).
go_tool() {
  local name=$1 module=$2 version=$3 package=$4 bin=$5 work=$6 ldflags=${7:-} tags=${8:-}
  rm -rf "$work"
  _throwaway_module "$work" "$package"
  (
    cd "$work"
    go get "$module@$version" 2>&1 | grep -v '^go: downloading' || true
    echo "building $name $version"
    go build -trimpath -tags "$tags" -ldflags "-s -w $ldflags" -o "$bin/$name" "$package"
  )
}

# crds_from_go_types CONTROLLER_GEN MODULE VERSION PACKAGE WORK CRD_DIR
# writes the CRDs of the API types in PACKAGE (a package of MODULE at VERSION) to CRD_DIR, with controller-gen run in
# WORK, a throwaway module that imports PACKAGE.
crds_from_go_types() {
  local controller_gen=$1 module=$2 version=$3 package=$4 work=$5 crd_dir=$6
  _throwaway_module "$work" "$package"
  mkdir -p "$crd_dir"
  (
    cd "$work"
    go get "$module@$version" 2>&1 | grep -v '^go: downloading' || true
    echo "generating CRDs from $package ($module@$version)"
    "$controller_gen" crd:crdVersions=v1 "paths=$package" "output:crd:dir=$crd_dir"
  )
}

# _throwaway_module WORK PACKAGE: a module in WORK whose one file imports PACKAGE.
_throwaway_module() {
  mkdir -p "$1"
  printf 'module finetune.dev/build/%s\n\ngo 1.26.0\n' "$(basename "$1")" > "$1/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$2" > "$1/tools.go"
}
