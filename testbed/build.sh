#!/usr/bin/env bash
# Build one stack's testbed binaries from its committed wrapper modules into a cache dir outside the repo.
# Usage: build.sh [--stack NAME] [--key | --check]
#   --key: print the cache key; --check: print the bin dir and exit 0 if built, else exit 1 (builds nothing)
#
# Cache key: the stack's versions.env, the Go version, the wrapper go.mod/go.sum files and $recipe (the
# flags that shape the binaries) -- not this script's text, so editing messages never forces a rebuild.
# Change $recipe whenever a change here changes what gets built. A stamp makes a repeat build a no-op.
# Builds of one key are serialised by a lock per key; different stacks build side by side.
#
# The real node's parts are cached apart, each under a key of its own inputs, so adding or changing them
# never invalidates the control plane's binaries: the kubelet (wrapper gomod/kubelet, left out of the key
# above; key = versions.env, Go version, its go.mod/go.sum, $node_recipe) in <cache>/kubelet/<key>/, and the
# sandbox and workload programs (testbed/images; key = their sources' hash, Go version, $images_recipe) in
# <cache>/images/<key>/. Their paths go to stdout as `kubelet=PATH` and `node-images=DIR` lines before the
# bin dir. A stack without gomod/kubelet, or DISPATCH_TESTBED_REAL_NODE=0, builds neither.
#
# stderr carries one line per step, `[testbed build] <event> <component> [...]` (events: plan, log,
# start, done, failed, up-to-date), which dispatch.testbed turns into progress; the Go tool's own output
# goes to the log file named by the `log` line (DISPATCH_TESTBED_BUILD_LOG overrides it).
# Prints the bin dir on the last line of stdout.
set -euo pipefail
# The whole script is one function, so bash has parsed all of it before running any of it: editing (or
# checking out another version of) this file during a 25-minute build cannot derail the running build.
main() {
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=testbed/stack.sh
. "$here/stack.sh"
# shellcheck source=/dev/null
. "$sdir/versions.env"
export GOTOOLCHAIN=local GOFLAGS=-modcacherw CGO_ENABLED=0
jobs="${DISPATCH_TESTBED_BUILD_JOBS:-2}"
cache="${DISPATCH_TESTBED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dispatch-testbed}"
gover="$(go env GOVERSION)"
k8s_tags="selinux,notest,grpcnotrace"
recipe="recipe=1 cgo=0 trimpath ldflags=-s,-w k8s-tags=$k8s_tags k8s-version-ldflags"
# Every wrapper but the kubelet's, in the glob's order: the key stays what it was before the kubelet came.
cp_mods=()
for f in "$sdir"/gomod/*/go.mod "$sdir"/gomod/*/go.sum; do
  [[ "$f" == "$sdir/gomod/kubelet/"* ]] || cp_mods+=("$f")
done
key="$( { cat "$sdir/versions.env"; echo "$gover"; cat "${cp_mods[@]}"; echo "$recipe"; } \
        | sha256sum | cut -c1-16)"
if [ "${args[0]:-}" = "--key" ]; then echo "$key"; exit 0; fi
ev() { echo "[testbed build] $*" >&2; }

# The real node's parts (see the header).
node_recipe="node-recipe=1 cgo=0 trimpath ldflags=-s,-w k8s-tags=$k8s_tags k8s-version-ldflags"
images_recipe="images-recipe=1 cgo=0 trimpath ldflags=-s,-w"
want_kubelet=0; want_images=0
case "${DISPATCH_TESTBED_REAL_NODE:-auto}" in
  0|off|false|no) ;;
  *) [ -f "$sdir/gomod/kubelet/go.mod" ] && want_kubelet=1
     [ -f "$here/images/go.mod" ] && want_images=1 ;;
esac
kdir=""; idir=""
if [ "$want_kubelet" = 1 ]; then
  kkey="$( { cat "$sdir/versions.env"; echo "$gover"; cat "$sdir/gomod/kubelet/go.mod" "$sdir/gomod/kubelet/go.sum"
             echo "$node_recipe"; } | sha256sum | cut -c1-16)"
  kdir="$cache/kubelet/$kkey"
fi
if [ "$want_images" = 1 ]; then
  ikey="$( { echo "$gover"; (cd "$here/images" && find . -type f \( -name '*.go' -o -name go.mod \) -print0 \
             | LC_ALL=C sort -z | xargs -0 sha256sum); echo "$images_recipe"; } | sha256sum | cut -c1-16)"
  idir="$cache/images/$ikey"
fi
kubelet_ok() { [ "$want_kubelet" = 0 ] || [ -x "$kdir/kubelet" ]; }
images_ok() { [ "$want_images" = 0 ] || { [ -x "$idir/pause" ] && [ -x "$idir/workload" ]; }; }
emit() { # the build's outputs on stdout, the bin dir last
  if [ "$want_kubelet" = 1 ]; then echo "kubelet=$kdir/kubelet"; fi
  if [ "$want_images" = 1 ]; then echo "node-images=$idir"; fi
  echo "$bin"
}

all=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok jobset trainer kueue)
complete() { [ -f "$1/.stamp" ] || return 1; for b in "${all[@]}"; do [ -x "$1/$b" ] || return 1; done; }

# A bin dir built under an earlier key scheme from exactly these inputs (same files, same flags) is
# reused rather than rebuilt: `cache-aliases` maps this key to that dir's name, one "KEY OLDKEY" a line.
resolve_bin() {
  bin="$cache/bin/$key"
  complete "$bin" && return 0
  if [ -f "$sdir/cache-aliases" ]; then
    local k old
    while read -r k old _; do
      if [ "$k" = "$key" ] && [ -n "${old:-}" ] && complete "$cache/bin/$old"; then bin="$cache/bin/$old"; return 0; fi
    done < <(grep -v '^#' "$sdir/cache-aliases")
  fi
  bin="$cache/bin/$key"
  return 1
}

stack_ok=0
if resolve_bin; then stack_ok=1; fi
if [ "$stack_ok" = 1 ] && kubelet_ok && images_ok; then ev "up-to-date $stack $bin"; emit; exit 0; fi
[ "${args[0]:-}" = "--check" ] && exit 1
mkdir -p "$cache/logs"
exec 9>"$cache/.build-$key.lock"
flock 9
stack_ok=0
if resolve_bin; then stack_ok=1; fi
if [ "$stack_ok" = 1 ] && kubelet_ok && images_ok; then  # built while we waited
  ev "up-to-date $stack $bin"; emit; exit 0
fi
mkdir -p "$bin"

only="${DISPATCH_TESTBED_BUILD_ONLY:-k8s etcd kwok jobset trainer kueue kubelet images}"
want() { [[ " $only " == *" $1 "* ]]; }
plan=()
if [ "$stack_ok" = 0 ]; then
  want k8s && plan+=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  for c in etcd kwok jobset trainer kueue; do want "$c" && plan+=("$c"); done
fi
want kubelet && ! kubelet_ok && plan+=(kubelet)
want images && ! images_ok && plan+=(pause workload)
suffix=""; [ "$stack_ok" = 1 ] && suffix="-node"  # the control plane's own log stays as its build left it
logf="${DISPATCH_TESTBED_BUILD_LOG:-$cache/logs/build-$stack-$key$suffix.log}"
: > "$logf"
ev "log $logf"
ev "plan $stack ${plan[*]}"
{ echo "stack $stack key $key go $gover -p $jobs output $bin"; cat "$sdir/versions.env"; df -h "$cache" || true; } >> "$logf"
t0=$(date +%s)

planned() { [[ " ${plan[*]} " == *" $1 "* ]]; }
step() { # name dir pkg outdir [go build flags...]
  local name="$1" dir="$2" pkg="$3" out="$4" t rc=0
  shift 4
  ev "start $name"; t=$(date +%s)
  echo "== $name: go build $* $pkg" >> "$logf"
  mkdir -p "$out"
  # Into a temporary name first: an interrupted build never leaves a half-written binary that looks built.
  (cd "$dir" && go build -p "$jobs" -trimpath "$@" -o "$out/.$name.tmp" "$pkg") >> "$logf" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then ev "failed $name $(( $(date +%s) - t )) exit=$rc"; exit "$rc"; fi
  mv -f "$out/.$name.tmp" "$out/$name"
  ev "done $name $(( $(date +%s) - t ))"
}

# The version flags every Kubernetes binary gets (the kubelet too, so the real node reports the stack's version).
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
commit="$(printf '%s' "$K8S_VERSION" | sha1sum | cut -c1-40)"
date_="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.gitCommit=$commit -X $p.buildDate=$date_"
done
for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  if planned "$c"; then step "$c" "$sdir/gomod/k8s" "k8s.io/kubernetes/cmd/$c" "$bin" -tags="$k8s_tags" -ldflags="$ld"; fi
done
if planned etcd; then step etcd "$sdir/gomod/k8s" go.etcd.io/etcd/server/v3 "$bin" -ldflags="-s -w"; fi
if planned kwok; then step kwok "$sdir/gomod/kwok" sigs.k8s.io/kwok/cmd/kwok "$bin" -ldflags="-s -w"; fi
if planned jobset; then step jobset "$sdir/gomod/jobset" sigs.k8s.io/jobset "$bin" -ldflags="-s -w"; fi
if planned trainer; then
  step trainer "$sdir/gomod/trainer" github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager "$bin" -ldflags="-s -w"
fi
if planned kueue; then step kueue "$sdir/gomod/kueue" sigs.k8s.io/kueue/cmd/kueue "$bin" -ldflags="-s -w"; fi
# After the control plane: the kubelet shares most of its packages, so the Go build cache is warm by now.
if planned kubelet; then
  step kubelet "$sdir/gomod/kubelet" k8s.io/kubernetes/cmd/kubelet "$kdir" -tags="$k8s_tags" -ldflags="$ld"
fi
for c in pause workload; do
  if planned "$c"; then step "$c" "$here/images" "./$c" "$idir" -ldflags="-s -w"; fi
done

ok=1; for b in "${all[@]}"; do [ -x "$bin/$b" ] || ok=0; done
if [ "$ok" = 1 ]; then
  { echo "built=$(date -u +%FT%TZ)"; echo "stack=$stack"; echo "go=$gover"; cat "$sdir/versions.env"; } > "$bin/.stamp"
fi
echo "== done in $(( $(date +%s) - t0 ))s" >> "$logf"
df -h "$cache" >> "$logf" 2>&1 || true
emit
}
# On one line: bash has read it whole before main runs, so nothing of this file is read after a build began.
main "$@"; exit
