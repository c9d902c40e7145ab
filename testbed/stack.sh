# Sourced by the testbed scripts: picks the stack (a directory testbed/stacks/NAME holding versions.env and
# the wrapper modules gomod/<component>/) from `--stack NAME` in "$@", else $DISPATCH_TESTBED_STACK, else the
# name in testbed/stacks/default. Sets: stack, sdir, and args (the remaining arguments).
# shellcheck shell=bash
stack="${DISPATCH_TESTBED_STACK:-}"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --stack) [ $# -ge 2 ] || { echo "--stack needs a name" >&2; exit 2; }; stack="$2"; shift 2 ;;
    --stack=*) stack="${1#--stack=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
[ -n "$stack" ] || stack="$(tr -d '[:space:]' < "$here/stacks/default")"
known="$(cd "$here/stacks" && for d in */versions.env; do printf '%s ' "${d%/versions.env}"; done)"
if [[ ! "$stack" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || [ ! -f "$here/stacks/$stack/versions.env" ]; then
  echo "unknown testbed stack '$stack' (known: ${known% })" >&2
  exit 2
fi
sdir="$here/stacks/$stack"
