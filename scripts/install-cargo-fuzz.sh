#!/usr/bin/env bash
# Puts the pinned cargo-fuzz into a local directory when it is not there yet, and prints its path.
#
#   scripts/install-cargo-fuzz.sh            # installs into .tools/bin of this repository
#
# Order: $SEQUENCED_CARGO_FUZZ, the tools directory, then PATH, each used only when it is the
# pinned version; else `cargo install` from crates.io (a minute or two on 2 cores, once: later
# runs find it in .tools/bin). It is built with the stable toolchain; running it needs
# RUSTC_BOOTSTRAP=1 (scripts/fuzz.sh sets it).
# Progress goes to stderr; the last line on stdout is the path of the cargo-fuzz binary.
set -euo pipefail

CARGO_FUZZ_VERSION="${CARGO_FUZZ_VERSION:-0.13.2}"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="${SEQUENCED_TOOLS_ROOT:-$repo/.tools}"

log() { echo "install-cargo-fuzz: $*" >&2; }

is_pinned() {
  [ -x "$1" ] || return 1
  [ "$("$1" --version 2>/dev/null)" = "cargo-fuzz $CARGO_FUZZ_VERSION" ]
}

for candidate in "${SEQUENCED_CARGO_FUZZ:-}" "$root/bin/cargo-fuzz" "$(command -v cargo-fuzz 2>/dev/null || true)"; do
  if [ -n "$candidate" ] && is_pinned "$candidate"; then
    log "using $candidate (cargo-fuzz $CARGO_FUZZ_VERSION)"
    echo "$candidate"
    exit 0
  fi
done

log "installing cargo-fuzz $CARGO_FUZZ_VERSION into $root/bin with cargo install"
cargo install --quiet --locked --root "$root" --version "$CARGO_FUZZ_VERSION" cargo-fuzz >&2
is_pinned "$root/bin/cargo-fuzz" || { log "cargo installed no working cargo-fuzz $CARGO_FUZZ_VERSION"; exit 1; }
echo "$root/bin/cargo-fuzz"
