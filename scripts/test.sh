#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, clippy with warnings as errors, every test
# (unit, integration, doc). Installs helm into .tools/bin first when none is found.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SEQUENCED_HELM="$(scripts/install-helm.sh)"
export SEQUENCED_HELM

echo "== cargo fmt --check" >&2
cargo fmt --all -- --check
echo "== cargo clippy" >&2
cargo clippy --all-targets --locked -- -D warnings
echo "== tests" >&2
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --all-targets --locked --no-fail-fast
else
  cargo test --all-targets --locked --no-fail-fast
fi
cargo test --doc --locked
