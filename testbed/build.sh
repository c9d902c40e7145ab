#!/usr/bin/env bash
# Build every testbed binary from the committed wrapper modules into a cache dir outside the repo.
# A stamp file keyed on versions + wrapper go.mod/go.sum + go version makes repeat builds a no-op.
# Prints the bin dir on the last line of stdout.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=/dev/null
. "$here/versions.env"
export GOTOOLCHAIN=local GOFLAGS=-modcacherw CGO_ENABLED=0
jobs="${DISPATCH_TESTBED_BUILD_JOBS:-2}"
cache="${DISPATCH_TESTBED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dispatch-testbed}"
gover="$(go env GOVERSION)"
key="$( { cat "$here/versions.env"; echo "$gover"; cat "$here"/gomod/*/go.mod "$here"/gomod/*/go.sum; cat "$0"; } | sha256sum | cut -c1-16)"
bin="$cache/bin/$key"
stamp="$bin/.stamp"
log() { echo "[testbed build $(date -u +%H:%M:%S)] $*" >&2; }

all=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok jobset trainer kueue)
if [ -f "$stamp" ]; then
  ok=1; for b in "${all[@]}"; do [ -x "$bin/$b" ] || ok=0; done
  if [ "$ok" = 1 ]; then log "up to date: $bin"; echo "$bin"; exit 0; fi
fi
mkdir -p "$bin"
log "go $gover, -p $jobs, output $bin"
df -h "$cache" >&2 || true
t0=$(date +%s)

only="${DISPATCH_TESTBED_BUILD_ONLY:-k8s etcd kwok jobset trainer kueue}"
want() { [[ " $only " == *" $1 "* ]]; }

if want k8s; then
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  commit="$(printf '%s' "$K8S_VERSION" | sha1sum | cut -c1-40)"
  date_="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.gitCommit=$commit -X $p.buildDate=$date_"
  done
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    log "building $c $K8S_VERSION"; t=$(date +%s)
    (cd "$here/gomod/k8s" && go build -p "$jobs" -trimpath -tags=selinux,notest,grpcnotrace -ldflags="$ld" -o "$bin/$c" "k8s.io/kubernetes/cmd/$c")
    log "built $c in $(( $(date +%s) - t ))s"
  done
fi
if want etcd; then
  log "building etcd $ETCD_VERSION"; t=$(date +%s)
  (cd "$here/gomod/k8s" && go build -p "$jobs" -trimpath -ldflags="-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
  log "built etcd in $(( $(date +%s) - t ))s"
fi
ctl() { # name pkg
  log "building $1"; t=$(date +%s)
  (cd "$here/gomod/$1" && go build -p "$jobs" -trimpath -ldflags="-s -w" -o "$bin/$1" "$2")
  log "built $1 in $(( $(date +%s) - t ))s"
}
want kwok && ctl kwok sigs.k8s.io/kwok/cmd/kwok
want jobset && ctl jobset sigs.k8s.io/jobset
want trainer && ctl trainer github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager
want kueue && ctl kueue sigs.k8s.io/kueue/cmd/kueue

ok=1; for b in "${all[@]}"; do [ -x "$bin/$b" ] || ok=0; done
if [ "$ok" = 1 ]; then
  { echo "built=$(date -u +%FT%TZ)"; echo "go=$gover"; cat "$here/versions.env"; } > "$stamp"
fi
log "done in $(( $(date +%s) - t0 ))s"
df -h "$cache" >&2 || true
echo "$bin"
