#!/usr/bin/env bash
# Writes the CRD generated from the Rust types (src/api) to every place that ships it.
# tests/crd.rs fails when any copy differs from what the code generates.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo run --quiet --locked -- crd > crds/sequencedrelease.yaml
cp crds/sequencedrelease.yaml charts/sequenced/crds/sequencedrelease.yaml
cp crds/sequencedrelease.yaml deploy/sequencedrelease.yaml
