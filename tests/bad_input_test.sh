#!/usr/bin/env bash
# The bad-input matrix: every option and config field out of range, malformed files of every
# kind foundry reads, and mismatches between them must fail with exit code 1 (or a
# command-line error), an "error:" line naming the input, a "hint:" line, and no file
# created, changed or removed. The cases are a table in tests/bad_input.py.
set -euo pipefail
exec python3 "$(dirname "$0")/bad_input.py" "$@"
