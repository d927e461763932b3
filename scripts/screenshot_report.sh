#!/usr/bin/env bash
# Render a run folder's report.html in headless Chromium and save a full-page screenshot.
# Usage: bash scripts/screenshot_report.sh runs/<run>/report.html [out.png] [width] [height]
# Needs Chromium (Debian: apt-get install chromium; or set CHROMIUM to its binary).
set -euo pipefail
REPORT="${1:?usage: screenshot_report.sh runs/<run>/report.html [out.png] [width] [height]}"
OUT="${2:-${REPORT%.html}.png}"
WIDTH="${3:-1200}"
HEIGHT="${4:-4000}"
if [ ! -f "$REPORT" ]; then
  echo "error: no report at $REPORT (a run folder's report.html)" >&2
  exit 2
fi
BROWSER="${CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}"
if [ -z "$BROWSER" ]; then
  echo "error: Chromium not found; install it (Debian: apt-get install chromium) or set CHROMIUM" >&2
  exit 2
fi
PROFILE="$(mktemp -d)"
trap 'rm -rf "$PROFILE"' EXIT
# The page is self-contained; the flags keep Chromium off the network and out of $HOME.
"$BROWSER" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --hide-scrollbars --user-data-dir="$PROFILE" --window-size="$WIDTH,$HEIGHT" \
  --screenshot="$(realpath -m "$OUT")" "file://$(realpath "$REPORT")" 2>/dev/null
test -s "$OUT" || { echo "error: Chromium wrote no screenshot" >&2; exit 1; }
echo "$OUT"
