#!/usr/bin/env bash
# Sets up everything, prepares the built-in corpus and trains configs/quickstart.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
MF=build/release/moeforge
$MF doctor --threads 2
$MF data prepare configs/quickstart.toml
$MF train configs/quickstart.toml --overwrite "$@"
