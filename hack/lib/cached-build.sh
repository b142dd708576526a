# Sourced by the build scripts of cached Go components (hack/kueue/build.sh, hack/registry/build.sh):
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
