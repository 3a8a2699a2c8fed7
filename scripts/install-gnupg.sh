#!/usr/bin/env bash
# Makes sure gpg is installed: the tests of chart verification make an OpenPGP test key with it
# for `helm package --sign` (tests/support/src/signing.rs). Installs Debian's gnupg with apt-get
# only when no gpg is found. Prints the path of gpg.
set -euo pipefail
if ! command -v gpg >/dev/null 2>&1; then
  echo "install-gnupg: gpg not found; installing Debian's gnupg" >&2
  if [ "$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends gnupg >&2
fi
command -v gpg
