#!/usr/bin/env bash
# Puts the pinned mdbook into a local directory when it is not there yet, and prints its path.
#
#   scripts/install-mdbook.sh                      # installs into .tools/bin of this repository
#   "$(scripts/install-mdbook.sh)" build docs      # builds the book into docs/book
#
# Order: $SEQUENCED_MDBOOK, the tools directory, then PATH, each used only when it is the pinned
# version; else `cargo install` from crates.io (about 3 minutes on 2 cores, once: later runs find
# it in .tools/bin). Only the search feature is built: the book needs no `mdbook serve`.
# Progress goes to stderr; the last line on stdout is the path of the mdbook binary.
set -euo pipefail

MDBOOK_VERSION="${MDBOOK_VERSION:-0.5.4}"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="${SEQUENCED_TOOLS_ROOT:-$repo/.tools}"

log() { echo "install-mdbook: $*" >&2; }

is_pinned() {
  [ -x "$1" ] || return 1
  [ "$("$1" --version 2>/dev/null)" = "mdbook v$MDBOOK_VERSION" ]
}

for candidate in "${SEQUENCED_MDBOOK:-}" "$root/bin/mdbook" "$(command -v mdbook 2>/dev/null || true)"; do
  if [ -n "$candidate" ] && is_pinned "$candidate"; then
    log "using $candidate (mdbook v$MDBOOK_VERSION)"
    echo "$candidate"
    exit 0
  fi
done

log "installing mdbook $MDBOOK_VERSION into $root/bin with cargo install"
cargo install --quiet --locked --root "$root" --version "$MDBOOK_VERSION" \
  --no-default-features --features search mdbook >&2
is_pinned "$root/bin/mdbook" || { log "cargo installed no working mdbook $MDBOOK_VERSION"; exit 1; }
echo "$root/bin/mdbook"
