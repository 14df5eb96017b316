#!/bin/bash
# Example lifecycle (bootstrap) script: install hma on a compute node with the distribution's
# package manager, write the site configuration, enable and start the agent.
# See docs/packaging.md. Run as root, e.g. from a cluster's on-create hook:
#
#   HMA_RECOVERY_POLICY=automatic HMA_EXPECTED_GPUS=8 HMA_EXPECTED_EFA_ADAPTERS=32 \
#       ./install_hma.sh /path/to/hma_0.1.0_all.deb
#
# Usage: install_hma.sh [--deep-check STAGES] [PACKAGE]    install_hma.sh --help: this text
#
# Settings (environment), each written only when set:
#   HMA_PACKAGE / $1             .deb or .rpm file (or an http(s) URL); default: the newest
#                                hma_*.deb or hma-*.rpm next to this script
#   HMA_RECOVERY_POLICY          [recovery] policy: automatic (drain, reboot, replace) or none
#                                (label only); default automatic, the agent's own default
#   HMA_DRY_RUN                  [recovery] dry_run: true = decide and log, change nothing
#   HMA_INSTANCE_TYPE            [agent] instance_type (else read from DMI product_name)
#   HMA_EXPECTED_GPUS            [probes.gpu] and [probes.nvidia_smi] expected_gpus
#   HMA_EXPECTED_NEURON_DEVICES  [probes.neuron] expected_devices
#   HMA_EXPECTED_EFA_ADAPTERS    [probes.efa] expected_adapters
#   HMA_EXTRA_TOML               more TOML appended verbatim (any key of `hma config defaults`)
#   HMA_START                    0 = install and configure only (default 1)
#   HMA_APT_UPDATE               0 = skip `apt-get update` (default 1)
# Option --deep-check STAGES (before the package; e.g. stress,accelerators,dcgm,efa): run those
# `hma deep-check` stages once the agent runs (cluster creation, scale-up); a failing stage is
# recorded for the agent (which drains per policy) and this script exits 2 (docs/deep-check.md).
# The settings go to /etc/hma/hma.d/50-lifecycle.toml, so the packaged /etc/hma/hma.toml stays
# untouched and package upgrades never stop at a conffile question.
set -euo pipefail

usage() {  # the comment block above, from its second line to the line before `set`
  echo "Usage: $(basename "$0") [--deep-check STAGES] [PACKAGE]"
  echo
  sed -n '2,/^set -euo pipefail$/{/^set /d;s/^# \{0,1\}//;p}' "$0"
}
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
esac

log() { echo "install_hma: $*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  # The comment block at the top of this file, without the '#'s.
  sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"
  exit 0
fi
[[ $(id -u) -eq 0 ]] || die "run as root"
here=$(cd "$(dirname "$0")" && pwd)
deep_check=
if [[ "${1:-}" == --deep-check ]]; then
  [[ -n "${2:-}" ]] || die "--deep-check needs a comma-separated list of stages"
  deep_check=$2
  shift 2
fi
[[ "${1:-}" != -* ]] || die "unknown option $1 (--help lists them)"
package=${1:-${HMA_PACKAGE:-}}
if [[ -z "$package" ]]; then
  package=$(ls -t "$here"/hma_*.deb "$here"/hma-*.rpm 2>/dev/null | head -1 || true)
  [[ -n "$package" ]] || die "no package given (argument, HMA_PACKAGE, or next to this script)"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [[ "$package" == http://* || "$package" == https://* ]]; then
  name=${package##*/}
  if command -v curl >/dev/null; then
    curl -fsSL --retry 3 -o "$tmp/$name" "$package"
  else
    wget -q -O "$tmp/$name" "$package"
  fi
  package=$tmp/$name
fi
[[ -f "$package" ]] || die "$package: no such file"
package=$(cd "$(dirname "$package")" && pwd)/$(basename "$package")

# Check the settings before touching the node.
for var in HMA_EXPECTED_GPUS HMA_EXPECTED_NEURON_DEVICES HMA_EXPECTED_EFA_ADAPTERS; do
  value=${!var:-}
  [[ -z "$value" || "$value" =~ ^[0-9]+$ ]] || die "$var must be a whole number, not '$value'"
done
case "${HMA_RECOVERY_POLICY:-automatic}" in
  automatic | none) ;;
  *) die "HMA_RECOVERY_POLICY must be automatic or none" ;;
esac
case "${HMA_DRY_RUN:-}" in
  "" | true | false) ;;
  *) die "HMA_DRY_RUN must be true or false" ;;
esac

# 1. Install with the distribution's package manager (dependencies from its own archive).
case "$package" in
  *.deb)
    command -v apt-get >/dev/null || die "a .deb needs apt-get"
    export DEBIAN_FRONTEND=noninteractive
    [[ "${HMA_APT_UPDATE:-1}" == 0 ]] || apt-get update -qq
    apt-get install -y -q -o Dpkg::Options::=--force-confold "$package"
    ;;
  *.rpm)
    if command -v dnf >/dev/null; then
      dnf install -y "$package"
    elif command -v yum >/dev/null; then
      yum install -y "$package"
    else
      die "an .rpm needs dnf or yum"
    fi
    ;;
  *) die "$package: neither .deb nor .rpm" ;;
esac
command -v hma >/dev/null || die "the package installed no hma command"
log "installed $(hma --version)"

# 2. Site configuration as a drop-in, validated before the agent sees it.
toml_str() { printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g')"; }
{
  echo "# Written by install_hma.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ); see hma config defaults."
  echo "[recovery]"
  echo "policy = $(toml_str "${HMA_RECOVERY_POLICY:-automatic}")"
  if [[ -n "${HMA_DRY_RUN:-}" ]]; then echo "dry_run = $HMA_DRY_RUN"; fi
  if [[ -n "${HMA_INSTANCE_TYPE:-}" ]]; then
    printf '\n[agent]\ninstance_type = %s\n' "$(toml_str "$HMA_INSTANCE_TYPE")"
  fi
  if [[ -n "${HMA_EXPECTED_GPUS:-}" ]]; then
    for probe in gpu nvidia_smi; do  # one count, both readers of the same GPUs
      printf '\n[probes.%s]\nexpected_gpus = %s\n' "$probe" "$HMA_EXPECTED_GPUS"
    done
  fi
  if [[ -n "${HMA_EXPECTED_NEURON_DEVICES:-}" ]]; then
    printf '\n[probes.neuron]\nexpected_devices = %s\n' "$HMA_EXPECTED_NEURON_DEVICES"
  fi
  if [[ -n "${HMA_EXPECTED_EFA_ADAPTERS:-}" ]]; then
    printf '\n[probes.efa]\nexpected_adapters = %s\n' "$HMA_EXPECTED_EFA_ADAPTERS"
  fi
  if [[ -n "${HMA_EXTRA_TOML:-}" ]]; then printf '\n%s\n' "$HMA_EXTRA_TOML"; fi
} > "$tmp/50-lifecycle.toml"

dropin=/etc/hma/hma.d/50-lifecycle.toml
mkdir -p /etc/hma/hma.d
[[ ! -e "$dropin" ]] || cp -p "$dropin" "$tmp/previous.toml"
install -m 0644 "$tmp/50-lifecycle.toml" "$dropin"
if ! hma config check; then
  if [[ -e "$tmp/previous.toml" ]]; then cp -p "$tmp/previous.toml" "$dropin"; else rm -f "$dropin"; fi
  die "the configuration above is invalid; $dropin left as it was"
fi

# 3. Enable and start (the package enables the unit but starts it only here, once configured).
if [[ "${HMA_START:-1}" == 0 ]]; then
  log "HMA_START=0: not starting the agent"
elif [[ -d /run/systemd/system ]]; then
  systemctl daemon-reload
  systemctl enable hma.service
  systemctl restart hma.service
  systemctl --no-pager --lines=0 status hma.service || true
  log "hma is running; see \`hma status\` and \`journalctl -u hma\`"
else
  log "systemd is not running here: hma.service is enabled but not started"
fi

# 4. Deep check at first install (--deep-check STAGES).
if [[ -n "$deep_check" ]]; then
  log "deep check: $deep_check"
  rc=0
  hma deep-check --stages "$deep_check" || rc=$?
  case $rc in
    0) log "deep check passed" ;;
    1) log "deep check passed with warnings (see above)" ;;
    2) log "deep check FAILED: the agent has the findings (hma status)"; exit 2 ;;
    *) log "deep check gave no verdict (exit $rc): see above"; exit "$rc" ;;
  esac
fi
