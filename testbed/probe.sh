#!/usr/bin/env bash
# Check that every Go module needed to build the testbed can be downloaded, before spending
# half an hour compiling. Prints, in plain words, each module version that cannot be had.
# Usage: probe.sh [--stack NAME]. Exit status: 0 if everything is available, 1 otherwise.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=testbed/stack.sh
. "$here/stack.sh"
# shellcheck source=/dev/null
. "$sdir/versions.env"
export GOTOOLCHAIN=local GOFLAGS=-modcacherw
missing=0
report="$(mktemp)"
for d in "$sdir"/gomod/*/; do
  name="$(basename "$d")"
  [ -f "$d/go.mod" ] || continue
  echo "probe: $name ..."
  # Download exactly the modules whose packages the build compiles (plus their go.mod files).
  if ! out="$(cd "$d" && go list -deps -e -f '{{with .Error}}{{.}}{{end}}' tool 2>&1)"; then :; fi
  if ! out2="$(cd "$d" && go mod download all 2>&1)"; then :; fi
  printf '%s\n%s\n' "$out" "$out2" | grep -E 'not found|404|410|unknown revision|invalid version|verifying|missing go.sum|no matching versions|reading .*: ' \
    | sed -E "s/^/  [$name] /" >> "$report" || true
done
# Top-level modules named in versions.env must also be served.
for mv in "k8s.io/kubernetes@$K8S_VERSION" "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "sigs.k8s.io/kwok@$KWOK_VERSION" \
          "sigs.k8s.io/jobset@$JOBSET_VERSION" "github.com/kubeflow/trainer/v2@$TRAINER_VERSION" "sigs.k8s.io/kueue@$KUEUE_VERSION"; do
  if ! go mod download "$mv" >/dev/null 2>&1; then
    echo "  [top] $mv" >> "$report"
  fi
done
if [ -s "$report" ]; then
  missing=1
  echo "probe: these module versions could NOT be downloaded (missing from the module proxy or unverifiable):"
  grep -oE '[A-Za-z0-9._~/-]+@v[0-9][A-Za-z0-9.+_-]*' "$report" | sort -u | sed 's/^/  missing: /'
  echo "probe: raw errors:"; sort -u "$report"
else
  echo "probe: all module versions needed by testbed stack $stack are available (k8s $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, jobset $JOBSET_VERSION, trainer $TRAINER_VERSION, kueue $KUEUE_VERSION)."
fi
rm -f "$report"
exit "$missing"
