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
key="$( { cat "$sdir/versions.env"; echo "$gover"; cat "$sdir"/gomod/*/go.mod "$sdir"/gomod/*/go.sum; echo "$recipe"; } \
        | sha256sum | cut -c1-16)"
if [ "${args[0]:-}" = "--key" ]; then echo "$key"; exit 0; fi
ev() { echo "[testbed build] $*" >&2; }

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

if resolve_bin; then ev "up-to-date $stack $bin"; echo "$bin"; exit 0; fi
[ "${args[0]:-}" = "--check" ] && exit 1
mkdir -p "$cache/logs"
exec 9>"$cache/.build-$key.lock"
flock 9
if resolve_bin; then ev "up-to-date $stack $bin"; echo "$bin"; exit 0; fi  # built while we waited
mkdir -p "$bin"

only="${DISPATCH_TESTBED_BUILD_ONLY:-k8s etcd kwok jobset trainer kueue}"
want() { [[ " $only " == *" $1 "* ]]; }
plan=()
want k8s && plan+=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
for c in etcd kwok jobset trainer kueue; do want "$c" && plan+=("$c"); done
logf="${DISPATCH_TESTBED_BUILD_LOG:-$cache/logs/build-$stack-$key.log}"
: > "$logf"
ev "log $logf"
ev "plan $stack ${plan[*]}"
{ echo "stack $stack key $key go $gover -p $jobs output $bin"; cat "$sdir/versions.env"; df -h "$cache" || true; } >> "$logf"
t0=$(date +%s)

step() { # name dir pkg [go build flags...]
  local name="$1" dir="$2" pkg="$3" t rc=0
  shift 3
  ev "start $name"; t=$(date +%s)
  echo "== $name: go build $* $pkg" >> "$logf"
  (cd "$dir" && go build -p "$jobs" -trimpath "$@" -o "$bin/$name" "$pkg") >> "$logf" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then ev "failed $name $(( $(date +%s) - t )) exit=$rc"; exit "$rc"; fi
  ev "done $name $(( $(date +%s) - t ))"
}

if want k8s; then
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  commit="$(printf '%s' "$K8S_VERSION" | sha1sum | cut -c1-40)"
  date_="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.gitCommit=$commit -X $p.buildDate=$date_"
  done
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    step "$c" "$sdir/gomod/k8s" "k8s.io/kubernetes/cmd/$c" -tags="$k8s_tags" -ldflags="$ld"
  done
fi
want etcd && step etcd "$sdir/gomod/k8s" go.etcd.io/etcd/server/v3 -ldflags="-s -w"
want kwok && step kwok "$sdir/gomod/kwok" sigs.k8s.io/kwok/cmd/kwok -ldflags="-s -w"
want jobset && step jobset "$sdir/gomod/jobset" sigs.k8s.io/jobset -ldflags="-s -w"
want trainer && step trainer "$sdir/gomod/trainer" github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager -ldflags="-s -w"
want kueue && step kueue "$sdir/gomod/kueue" sigs.k8s.io/kueue/cmd/kueue -ldflags="-s -w"

ok=1; for b in "${all[@]}"; do [ -x "$bin/$b" ] || ok=0; done
if [ "$ok" = 1 ]; then
  { echo "built=$(date -u +%FT%TZ)"; echo "stack=$stack"; echo "go=$gover"; cat "$sdir/versions.env"; } > "$bin/.stamp"
fi
echo "== done in $(( $(date +%s) - t0 ))s" >> "$logf"
df -h "$cache" >> "$logf" 2>&1 || true
echo "$bin"
}
main "$@"
exit
