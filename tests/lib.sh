# Helpers for the end-to-end test scripts: source it, then call check/expect_fail.
set -uo pipefail
FOUNDRY="$(realpath "$1")"
SRC="$(realpath "$2")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
failures=0
passes=0

ok() { echo "ok: $*"; passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_fail "description" "substring the error must contain" cmd...
expect_fail() {
  local what="$1" needle="$2"
  shift 2
  local out
  if out="$("$@" 2>&1)"; then
    bad "$what: exited 0"
  elif ! grep -qF -- "$needle" <<<"$out"; then
    bad "$what: error does not mention '$needle':"
    echo "$out" | sed 's/^/    /'
  elif ! grep -q '^error: ' <<<"$out"; then
    bad "$what: no 'error:' line"
  else
    ok "$what"
  fi
}

finish() {
  echo "$passes passed, $failures failed"
  [ "$failures" -eq 0 ]
}
