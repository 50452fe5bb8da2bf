#!/usr/bin/env bash
# Screenshot of a report page as a reader sees it: headless Chromium (Debian's `chromium` package)
# at 1280×1500. Usage: bash scripts/screenshot_report.sh REPORT.html OUT.png
# Exit status 3 when no Chromium is installed (the test that calls this skips then).
set -euo pipefail
html=${1:?usage: screenshot_report.sh REPORT.html OUT.png}
out=${2:?usage: screenshot_report.sh REPORT.html OUT.png}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
  echo "screenshot_report: no chromium, chromium-browser or google-chrome on PATH (apt install chromium)" >&2
  exit 3
fi
abs=$(cd "$(dirname "$html")" && pwd)/$(basename "$html")
# --no-sandbox: root in a container; the dbus errors Chromium prints without a session bus are noise.
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1500 \
  --screenshot="$out" "file://$abs" 2>/dev/null >/dev/null
test -s "$out"
echo "screenshot: $out"
