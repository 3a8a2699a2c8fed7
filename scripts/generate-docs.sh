#!/usr/bin/env bash
# Writes the generated pages of the book's reference from the code, so they cannot drift:
#   docs/src/reference/api.md  the SequencedRelease API, from the CRD's schema and field docs
#                              (`sequenced crd --format markdown`)
#   docs/src/reference/cli.md  the --help of every command (`sequenced cli-reference`)
# tests/docs.rs fails when a committed page differs from what this writes. Run it after changing
# src/api (then scripts/generate-crds.sh too) or a command's flags or help text.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo run --quiet --locked -- crd --format markdown > docs/src/reference/api.md
cargo run --quiet --locked -- cli-reference > docs/src/reference/cli.md
