#!/usr/bin/env bash
# Runs its arguments where the CPU has AVX-512; elsewhere exits 77 (ctest's skip code). The
# *_below_avx512 tests limit oneDNN to AVX2 to test those paths on AVX-512 machines; on a CPU
# without AVX-512 the layers' own tests already ran there.
if ! grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "skipped: this CPU has no AVX-512, so the layer's own tests already ran below it"
  exit 77
fi
exec "$@"
