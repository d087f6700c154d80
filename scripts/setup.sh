#!/usr/bin/env bash
# Installs Foundry's build dependencies from Debian (only what is missing) and builds it.
# Usage: scripts/setup.sh [build-dir] [extra cmake args...]
#   FOUNDRY_BUILD_TARGETS="test_base test_model"   builds only these targets (default: all).
#   FOUNDRY_EXTRA_PACKAGES="python3-torch"          optional Debian packages to install beside
#                                                   them (a failure to install them warns: the
#                                                   tests that need them skip).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
shift || true

packages=(build-essential cmake pkg-config libdnnl-dev libopenmpi-dev openmpi-bin
          libsentencepiece-dev nlohmann-json3-dev libcli11-dev libfmt-dev libxxhash-dev
          libgtest-dev libgmock-dev libbenchmark-dev gnuplot-nox)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
extra=()
for p in ${FOUNDRY_EXTRA_PACKAGES:-}; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || extra+=("$p")
done
if [ ${#extra[@]} -gt 0 ]; then
  echo "setup: installing ${extra[*]} (optional)" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
      "${extra[@]}" >/dev/null; } ||
    echo "setup: warning: could not install ${extra[*]}; the tests that need them skip" >&2
fi

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
echo "setup: building in $build" >&2
if ! cmake --build "$build" -j"$(nproc)" ${FOUNDRY_BUILD_TARGETS:+--target $FOUNDRY_BUILD_TARGETS} \
    >"$build/build.log" 2>&1; then
  grep -E 'error|Error' "$build/build.log" | head -40 >&2
  echo "setup: build failed (full log: $build/build.log)" >&2
  exit 1
fi
