#!/usr/bin/env bash
# The demo: set up, fetch the nlp-corpus sentences (npm), prepare them (BPE vocabulary 8192),
# train a small MoE for about ten minutes, then show validation loss and a generated sample.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash scripts/setup.sh build
foundry=build/foundry
config=configs/demo.json

if [ ! -f data/raw/nlp-corpus/package/package.json ]; then
  echo "demo: fetching the nlp-corpus package with npm" >&2
  mkdir -p data/raw/nlp-corpus
  (cd data/raw/nlp-corpus && npm pack --silent nlp-corpus >/dev/null && tar xzf nlp-corpus-*.tgz)
fi
if [ ! -f data/nlp-corpus/meta.json ]; then
  "$foundry" data prepare --input data/raw/nlp-corpus/package/builds --out data/nlp-corpus \
    --vocab-size 8192
fi

# A fresh run each time (to continue the last one instead: drop the rm and add --resume).
rm -rf runs/demo
"$foundry" train --config "$config"
echo
"$foundry" eval --config "$config"
echo
echo "sample (temperature 0.8, top-p 0.95, seed 1):"
"$foundry" generate --config "$config" --prompt "The history of the" --max-new-tokens 48 --seed 1
