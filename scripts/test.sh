#!/usr/bin/env bash
# Sets up everything, builds, and runs the whole test suite (ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --preset release -j "$(nproc)"
