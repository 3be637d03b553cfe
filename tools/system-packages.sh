#!/usr/bin/env bash
# The Debian packages behind the commands the tests (or the demo) need: installed with apt-get when
# this runs as root and one is missing; otherwise a stop with the exact command to run.
#
#   tools/system-packages.sh [COMMAND ...]     default: every command the tests use
#
# ALLOW_SUDO=1 lets a non-root user with sudo install them (.ci/run sets it).
set -euo pipefail

declare -A PACKAGE=(
    [prometheus]=prometheus [promtool]=prometheus  # the AMP client and deletion-cost tests' real Prometheus
    [etcd]=etcd-server                             # the e2e control plane's store
    [openssl]=openssl                              # its service-account keys and test certificates
    [node]=nodejs                                  # jsii runs the CDK construct library (make synth)
    [cc]=gcc                                       # builds the NVML stand-in the GPU-reservation tests load
)
commands=("$@")
if [ ${#commands[@]} -eq 0 ]; then commands=(prometheus promtool etcd openssl node cc); fi

missing=()
for command in "${commands[@]}"; do
    package=${PACKAGE[$command]:?"tools/system-packages.sh: no package known for command $command"}
    if ! command -v "$command" >/dev/null 2>&1 && [[ " ${missing[*]} " != *" $package "* ]]; then
        missing+=("$package")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

install=(apt-get install -y -qq --no-install-recommends "${missing[@]}")
if [ "$EUID" -eq 0 ]; then
    sudo=()
elif [ "${ALLOW_SUDO:-}" = 1 ] && command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
else
    echo "missing system packages: ${missing[*]}. Install them (as root), then run make again:" >&2
    echo "    apt-get update && ${install[*]}" >&2
    exit 1
fi
echo "installing ${missing[*]} with apt-get" >&2
"${sudo[@]}" apt-get update -qq
# The packages' services are not wanted (and there is no init system here): only the binaries are used.
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" "${install[@]}" >/dev/null
