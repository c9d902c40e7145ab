#!/usr/bin/env bash
# Regenerate one stack's wrapper Go modules (testbed/stacks/NAME/gomod/) from its versions.env.
# Usage: gen-wrappers.sh [--stack NAME] [all|k8s|kubelet|kwok|jobset|trainer|kueue]
# Only needed when versions change; the generated go.mod/go.sum are committed.
# The kubelet (the real node's) has a wrapper of its own, so adding it never changes the k8s wrapper that
# the control plane's cache key hashes (build.sh keeps gomod/kubelet out of that key).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=testbed/stack.sh
. "$here/stack.sh"
# shellcheck source=/dev/null
. "$sdir/versions.env"
export GOTOOLCHAIN=local GOFLAGS=-modcacherw
only="${args[0]:-all}"

k8s_wrapper() { # name tool...: k8s.io/kubernetes at the stack's version, its staging modules replaced
  local name="$1" d="$sdir/gomod/$1" gomod minor
  shift
  mkdir -p "$d"; rm -f "$d/go.mod" "$d/go.sum"
  gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  minor="v0.${K8S_VERSION#v1.}"
  ( cd "$d"
    go mod init "dispatch.invalid/testbed/$name" >/dev/null 2>&1
    go mod edit -go="$(awk '$1=="go"{print $2; exit}' "$gomod")"
    godebug="$(awk '$1=="godebug"{print $2; exit}' "$gomod")"
    [ -n "$godebug" ] && go mod edit -godebug="$godebug"
    go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
    for m in $(awk '$2=="=>" && $3 ~ /^\.\/staging\// {print $1}' "$gomod"); do
      go mod edit -replace="$m=$m@$minor"
    done
    for t in "$@"; do go mod edit -tool="$t"; done
    go mod tidy
  )
}

ctl_wrapper() { # name module version toolpkg
  local name="$1" mod="$2" ver="$3" tool="$4" d="$sdir/gomod/$1" up
  mkdir -p "$d"; rm -f "$d/go.mod" "$d/go.sum"
  up="$(go mod download -json "$mod@$ver" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["Dir"])')"
  ( cd "$d"
    go mod init "dispatch.invalid/testbed/$name" >/dev/null 2>&1
    go mod edit -go="$(awk '$1=="go"{print $2; exit}' "$up/go.mod")"
    go mod edit -require="$mod@$ver" -tool="$tool"
    # Seed checksums from the upstream go.sum so resolution matches upstream.
    [ -f "$up/go.sum" ] && cp "$up/go.sum" go.sum && chmod u+w go.sum
    # Extra per-component replaces (served neighbour versions), one "module=module@version" per line.
    if [ -f "$sdir/gomod/$name.replace" ]; then
      grep -v '^#' "$sdir/gomod/$name.replace" | while read -r r; do [ -n "$r" ] && go mod edit -replace="$r"; done
    fi
    go mod tidy
  )
}

case "$only" in all|k8s) k8s_wrapper k8s k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl go.etcd.io/etcd/server/v3 ;; esac
case "$only" in all|kubelet) k8s_wrapper kubelet k8s.io/kubernetes/cmd/kubelet ;; esac
case "$only" in all|kwok) ctl_wrapper kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok ;; esac
case "$only" in all|jobset) ctl_wrapper jobset sigs.k8s.io/jobset "$JOBSET_VERSION" sigs.k8s.io/jobset ;; esac
case "$only" in all|trainer) ctl_wrapper trainer github.com/kubeflow/trainer/v2 "$TRAINER_VERSION" github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager ;; esac
case "$only" in all|kueue) ctl_wrapper kueue sigs.k8s.io/kueue "$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue ;; esac
