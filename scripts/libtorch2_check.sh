#!/usr/bin/env bash
# Builds and tests MoEForge against a pip LibTorch 2.x (e.g. a lent GPU machine whose python3 has
# torch) with Debian 12's builds of our other libraries carried in .dev2x/prefix.
#   here:  scripts/libtorch2_check.sh prepare     (downloads the Debian packages, unpacks them)
#   there: scripts/libtorch2_check.sh build       (configure + build into build/t2; logs to $OUT)
#          scripts/libtorch2_check.sh test [secs] (ctest -j$(nproc) within secs)
set -uo pipefail
cd "$(dirname "$0")/.."
R=$PWD
P=$R/.dev2x/prefix/usr
OUT=${OUT:-$R/.dev2x/logs}
PACKAGES="libtomlplusplus-dev libtomlplusplus3 libutf8proc-dev libutf8proc2 libpcre2-dev libpcre2-8-0
  libcpp-httplib-dev libcpp-httplib0.11 libgloo-dev libgtest-dev libgmock-dev googletest nlohmann-json3-dev
  libcli11-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libsentencepiece-dev libsentencepiece0 pkgconf
  pkgconf-bin libpkgconf3 libbrotli1"

prepare() {
  grep -qx "/.dev2x/" "$(git rev-parse --git-path info/exclude)" || echo "/.dev2x/" >>"$(git rev-parse --git-path info/exclude)"
  local debs
  debs=$(mktemp -d)
  (cd "$debs" && apt-get download $PACKAGES) || exit 1
  rm -rf "$R/.dev2x/prefix" && mkdir -p "$R/.dev2x/prefix"
  for d in "$debs"/*.deb; do dpkg -x "$d" "$R/.dev2x/prefix"; done
  # Gloo's headers only: pip's libtorch_cpu carries Gloo itself.
  rm -f "$P"/lib/libgloo.so*
  for f in "$P"/lib/x86_64-linux-gnu/pkgconfig/*.pc; do sed -i 's#^prefix=/usr$#prefix=${pcfiledir}/../../..#' "$f"; done
  for f in "$P"/share/pkgconfig/*.pc; do sed -i 's#^prefix=/usr$#prefix=${pcfiledir}/../..#' "$f"; done
  du -sh "$R/.dev2x"
}

T=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))" 2>/dev/null)
export PATH=$P/bin:$PATH
export PKG_CONFIG_PATH=$P/lib/x86_64-linux-gnu/pkgconfig:$P/share/pkgconfig
export LD_LIBRARY_PATH=$P/lib/x86_64-linux-gnu:$P/lib:$T/lib
B=$R/build/t2
case "${1:-}" in
  prepare) prepare ;;
  build)
    mkdir -p "$OUT"
    python3 -c "import torch;print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
      -DCMAKE_PREFIX_PATH="$T/share/cmake;$P" -DCMAKE_LIBRARY_PATH="$P/lib;$P/lib/x86_64-linux-gnu" \
      >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
    grep -iE "warn|fmt|torch|cuda" "$OUT/configure.log" | head -20
    (time cmake --build "$B" -j"$(nproc)" -k 0) >"$OUT/build.log" 2>&1
    echo "build rc=$?"
    grep -E "error|FAILED|undefined" "$OUT/build.log" | head -60
    tail -4 "$OUT/build.log" ;;
  test)
    mkdir -p "$OUT"
    (cd "$B" && MOEFORGE_SOURCE_DIR=$R timeout "${2:-600}" ctest -j"$(nproc)" --timeout 300 >"$OUT/ctest.log" 2>&1)
    echo "ctest rc=$?"
    grep -E "tests passed|Failed|\*\*\*|Not Run" "$OUT/ctest.log" | head -80 ;;
  *) sed -n 2,6p "$0"; exit 2 ;;
esac
