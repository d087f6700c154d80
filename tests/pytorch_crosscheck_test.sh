#!/usr/bin/env bash
# Foundry's fp32 forward passes, losses, gradient norms and every gradient tensor, for the
# standard MoE and for ZAYA1, against the independent PyTorch reference of both
# (bench/crosscheck_pytorch.sh, docs/pytorch-baseline.md): within 1e-4 relative. Skipped (77)
# where Debian's python3-torch is missing (scripts/test.sh installs it).
FOUNDRY="$1"
SRC="$2"
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "skipped: /usr/bin/python3 has no torch (apt-get install python3-torch)"
  exit 77
fi
FOUNDRY="$FOUNDRY" exec bash "$SRC/bench/crosscheck_pytorch.sh"
