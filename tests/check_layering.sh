#!/usr/bin/env bash
# The layering rules of docs/architecture.md, checked on the sources: the engine and the model
# know no paper, nothing below cli/ includes cli/, the trainer does not know serve/ or dist/, no
# shared folder names a method's config keys.
set -euo pipefail
SRC="${1:-$(dirname "$0")/../src}"
status=0
check() {  # check DESCRIPTION PATTERN DIR...
  local what="$1" pattern="$2"
  shift 2
  if hits=$(grep -rnE "$pattern" "$@" 2>/dev/null); then
    echo "layering: $what"$'\n'"$hits"
    status=1
  fi
}
check "moe/, model/, core/ and io/ must not include methods/" '#include "methods/' "$SRC/moe" "$SRC/model" "$SRC/core" "$SRC/io"
check "moe/ must not include model/" '#include "model/' "$SRC/moe"
check "nothing below cli/ includes cli/" '#include "cli/' "$SRC/core" "$SRC/moe" "$SRC/model" "$SRC/methods" "$SRC/io" \
  "$SRC/data" "$SRC/train" "$SRC/analysis" "$SRC/serve" "$SRC/dist"
check "the trainer does not depend on serve/" '#include "serve/' "$SRC/train"
check "the trainer does not depend on dist/ (dist/ wraps it through train/parallel.h)" '#include "dist/' "$SRC/train" "$SRC/model" "$SRC/moe"
check "a method's keys (model.moe.<method>.*) are known only to its folder: shared code asks the method registries" \
  '"model\.moe\.[a-z_]+\.[a-z_]+' "$SRC/core" "$SRC/moe" "$SRC/model" "$SRC/io" "$SRC/data" "$SRC/train" \
  "$SRC/analysis" "$SRC/serve" "$SRC/dist" "$SRC/cli"
[ "$status" -eq 0 ] && echo "layering: all rules hold"
exit "$status"
