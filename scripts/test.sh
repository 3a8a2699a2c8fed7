#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, clippy with warnings as errors, every test
# (unit, integration, doc), the book, and the chart archive fuzz target for a bounded time
# (scripts/fuzz.sh, on the stable toolchain). Installs helm (4 and 3) and kubectl into .tools/bin first when
# none is found, the pinned mdbook and cargo-fuzz (once; later runs find them there).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SEQUENCED_HELM="$(scripts/install-helm.sh)"
export SEQUENCED_HELM
# Helm 3 is the oracle of the releases Helm 3 wrote (tests/adopt.rs).
SEQUENCED_HELM3="$(scripts/install-helm.sh 3)"
export SEQUENCED_HELM3
# kubectl's built-in kustomize runs spec.postRenderers (and is their tests' oracle).
SEQUENCED_KUBECTL="$(scripts/install-kubectl.sh)"
export SEQUENCED_KUBECTL
# gpg makes the test keys of chart verification (helm package --sign).
scripts/install-gnupg.sh >/dev/null

echo "== cargo fmt --check" >&2
cargo fmt --all -- --check
# The workspace is this package and the test support crate (tests/support). Clippy lints both
# (--workspace). The test commands cover this package only: the support crate has no tests of its
# own, and --all-targets with --workspace would compile it once more as an empty test binary.
echo "== cargo clippy" >&2
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== tests" >&2
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --all-targets --locked --no-fail-fast
else
  cargo test --all-targets --locked --no-fail-fast
fi
cargo test --doc --locked
# The book (docs/). Its links and anchors, and those of README.md, CHANGELOG.md and
# ARCHITECTURE.md, are checked by tests/docs.rs above; here mdBook builds it, which fails on a
# chapter SUMMARY.md lists but that does not exist.
echo "== the book" >&2
mdbook="$(scripts/install-mdbook.sh)"
"$mdbook" build docs
# The chart loader against hostile archives (fuzz/fuzz_targets/chart_archive.rs), 90 s unless
# SEQUENCED_FUZZ_SECONDS says otherwise; the first run also builds the instrumented crates
# (several minutes; fuzz/target keeps them). A crash fails the run.
echo "== fuzz: chart_archive" >&2
scripts/fuzz.sh chart_archive "${SEQUENCED_FUZZ_SECONDS:-90}"
