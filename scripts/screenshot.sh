#!/usr/bin/env bash
# Headless screenshot of a built page: scripts/screenshot.sh _build/html/chapters/00_fl_primer.html out.png [height]
set -euo pipefail
page=$1; out=$2; height=${3:-2400}
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$(mktemp -d)" --window-size=${WIDTH:-1280},"$height" --virtual-time-budget=10000 \
  --hide-scrollbars --screenshot="$out" "file://$(realpath "$page")" 2>/dev/null
echo "$out"
