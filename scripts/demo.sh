#!/usr/bin/env bash
# The main job on a fresh clone: builds sequenced, installs helm if needed, and shows the deploy
# plan of the example charts: the layer graph, the lint verdict, and every document in deploy
# order with the chart and file it came from.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SEQUENCED_HELM="$(scripts/install-helm.sh)"
export SEQUENCED_HELM

echo "== building sequenced" >&2
cargo build --release --locked --quiet
bin=target/release/sequenced

for chart in examples/shop examples/foo examples/werf examples/kots examples/migrate; do
  echo
  echo "==================== sequenced graph $chart"
  "$bin" graph "$chart"
  echo
  echo "==================== sequenced lint $chart"
  "$bin" lint "$chart"
done
for chart in examples/shop examples/foo examples/migrate; do
  echo
  echo "==================== sequenced template $chart"
  "$bin" template "$chart"
done
echo
echo "==================== sequenced graph examples/foo --format mermaid"
"$bin" graph examples/foo --format mermaid
echo
echo "==================== sequenced template examples/foo --set bar.enabled=false (bar is left out)"
"$bin" template examples/foo --set bar.enabled=false | grep -E '^# (Charts|Not rendered)|^## START'
