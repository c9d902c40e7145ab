#!/usr/bin/env bash
# Build helm from its Go module (the chart's lint and render checks use it) into the testbed's cache dir,
# keyed by helm's version and the Go version; a repeat run is a no-op. Prints the binary's path last.
# Kept apart from build.sh so a helm bump never invalidates the cached control-plane binaries.
set -euo pipefail
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
export GOTOOLCHAIN=local GOFLAGS=-modcacherw CGO_ENABLED=0
cache="${DISPATCH_TESTBED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dispatch-testbed}"
gover="$(go env GOVERSION)"
dir="$cache/tools/helm-$HELM_VERSION-$gover"
if [ -x "$dir/helm" ]; then echo "$dir/helm"; exit 0; fi
mkdir -p "$dir"
echo "[helm build $(date -u +%H:%M:%S)] building helm $HELM_VERSION with $gover" >&2
t=$(date +%s)
major="${HELM_VERSION%%.*}"
GOBIN="$dir" go install -trimpath \
  -ldflags="-s -w -X helm.sh/helm/$major/internal/version.version=$HELM_VERSION -X helm.sh/helm/$major/internal/version.gitTreeState=clean" \
  "helm.sh/helm/$major/cmd/helm@$HELM_VERSION"
echo "[helm build $(date -u +%H:%M:%S)] built in $(( $(date +%s) - t ))s" >&2
echo "$dir/helm"
