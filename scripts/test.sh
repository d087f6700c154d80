#!/usr/bin/env bash
# Sets up and runs every test: the release build's full suite (unit, whole-model and
# end-to-end tests, including those labelled slow), then the unit tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer.
#   FOUNDRY_FAST=1 scripts/test.sh   skips the slow label and the sanitizer build.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"

# python3-torch: the independent PyTorch reference tests/pytorch_crosscheck_test.sh compares
# Foundry's losses and gradients with.
FOUNDRY_EXTRA_PACKAGES="python3-torch" bash scripts/setup.sh build
label_args=()
[ "${FOUNDRY_FAST:-0}" = 1 ] && label_args=(-LE slow)
ctest --test-dir build --output-on-failure "${label_args[@]}"

if [ "${FOUNDRY_FAST:-0}" != 1 ]; then
  echo "== sanitizer build (ASan + UBSan) ==" >&2
  # Without the CUDA backend (where the release build found a toolkit, this checks that the
  # layers build without it). Only the layers' unit-test binaries, which are all it runs.
  unit_tests=$(for d in src/*/; do compgen -G "$d*_test.cpp" >/dev/null && echo "test_$(basename "$d")"; done)
  FOUNDRY_BUILD_TARGETS="$(echo $unit_tests)" bash scripts/setup.sh build-asan -DFOUNDRY_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFOUNDRY_CUDA=OFF
  # Unit tests only; the end-to-end scripts exercise the same code through the release binary.
  ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -R '^[a-z]+$'
fi
