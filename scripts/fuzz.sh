#!/usr/bin/env bash
# Runs a fuzz target of fuzz/ for a bounded time, on the stable toolchain, and prints libFuzzer's
# numbers (executions, coverage, corpus). CI runs the chart archive target (scripts/test.sh).
#
#   scripts/fuzz.sh                                # chart_archive for 90 s
#   scripts/fuzz.sh chart_archive 600              # longer
#   scripts/fuzz.sh readiness_expression 60
#
# cargo fuzz needs nightly features (-Z flags, the sanitizer, libFuzzer's instrumentation);
# RUSTC_BOOTSTRAP=1 lets the stable compiler accept them, so no nightly toolchain is needed.
# cargo-fuzz comes from scripts/install-cargo-fuzz.sh. The first run builds sequenced and its
# dependencies instrumented (several minutes on 2 cores; fuzz/target keeps them). Inputs found
# are added to fuzz/corpus/TARGET (only the seed-* inputs are committed); a crash stops the run,
# exits non-zero and is written to fuzz/artifacts/TARGET, to be replayed with
# `RUSTC_BOOTSTRAP=1 cargo fuzz run TARGET fuzz/artifacts/TARGET/crash-...` in fuzz/.
set -euo pipefail

target="${1:-chart_archive}"
seconds="${2:-${SEQUENCED_FUZZ_SECONDS:-90}}"
sanitizer="${SEQUENCED_FUZZ_SANITIZER:-address}"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cargo_fuzz="$(scripts/install-cargo-fuzz.sh)"
export PATH="$(dirname "$cargo_fuzz"):$PATH"
export RUSTC_BOOTSTRAP=1

cd "$repo/fuzz"
mkdir -p target
log="target/$target.log"
echo "fuzz: building $target (sanitizer: $sanitizer)" >&2
cargo fuzz build --sanitizer "$sanitizer" "$target" >&2
echo "fuzz: running $target for $seconds s (libFuzzer's output in fuzz/$log)" >&2
status=0
cargo fuzz run --sanitizer "$sanitizer" "$target" -- \
  -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  > "$log" 2>&1 || status=$?
# The first and last status lines (inputs read, coverage and executions at the end), and the
# final statistics.
grep -E '^#[0-9]+ +(INITED|DONE)|^Done [0-9]+ runs|^stat::' "$log" >&2 || true
if [ "$status" -ne 0 ]; then
  echo "fuzz: $target failed (exit $status):" >&2
  tail -n 60 "$log" >&2
  exit "$status"
fi
