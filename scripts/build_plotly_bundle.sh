#!/usr/bin/env bash
# Rebuilds static/vendor/plotly-temper.min.js, the plotly.js bundle of only the traces Temper draws
# (scripts/plotly_bundle/entry.js), from the npm registry at the versions package-lock.json pins.
# Run by hand after changing entry.js or the pins (Node 20 or later, npm); the app never runs it and
# serves the committed file offline. The packages go to a scratch directory, removed afterwards.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

cp "$root"/scripts/plotly_bundle/{package.json,package-lock.json,entry.js,build.js} "$scratch"/
(cd "$scratch" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
node "$scratch/build.js" "$root/static/vendor/plotly-temper.min.js"
