#!/bin/bash
# Example lifecycle (bootstrap) script: install hma on a compute node with the distribution's
# package manager, write the site configuration, enable and start the agent.
# See docs/packaging.md. Run as root, e.g. from a cluster's on-create hook:
#
#   HMA_RECOVERY_POLICY=automatic HMA_EXPECTED_GPUS=8 HMA_EXPECTED_EFA_ADAPTERS=32 \
#       ./install_hma.sh /path/to/hma_0.1.0_all.deb
#
# Usage: install_hma.sh [--genconf] [--prometheus-textfile [DIR]] [--deep-check STAGES] [PACKAGE]
#        install_hma.sh --help: this text
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
#   HMA_CONFIG                   the main file (default /etc/hma/hma.toml); the drop-ins go to
#                                hma.d/ next to it
# Option --genconf: once the configuration checks, record what this node has now (`hma genconf`:
# GPUs, InfiniBand and EFA ports, memory, CPUs, mounted file systems) in hma.d/50-genconf.toml,
# held against from then on (docs/nhc.md); a file recorded before is kept (delete it to record
# again), so a re-run never records a node that lost a part as healthy.
# Option --prometheus-textfile [DIR]: turn the Prometheus reporter on (it is off by default),
# writing DIR/hma.prom for node_exporter's textfile collector (default DIR
# /var/lib/prometheus/node-exporter, Debian's); another DIR is created and added to the unit's
# ReadWritePaths (/etc/systemd/system/hma.service.d/50-textfile.conf). docs/alerting.md.
# Option --deep-check STAGES (before the package; e.g. stress,accelerators,dcgm,efa): run those
# `hma deep-check` stages once the agent runs (cluster creation, scale-up); a failing stage is
# recorded for the agent (which drains per policy) and this script exits 2 (docs/deep-check.md).
# The settings go to /etc/hma/hma.d/50-lifecycle.toml, so the packaged /etc/hma/hma.toml stays
# untouched and package upgrades never stop at a conffile question. The options come before the
# package.
set -euo pipefail

usage() {  # the comment block above, from its second line to the line before `set`
  echo "Usage: $(basename "$0") [--genconf] [--prometheus-textfile [DIR]] [--deep-check STAGES] [PACKAGE]"
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
genconf=0
textfile_dir=
textfile_default=/var/lib/prometheus/node-exporter
while [[ "${1:-}" == -* ]]; do
  case $1 in
    --deep-check)
      [[ -n "${2:-}" ]] || die "--deep-check needs a comma-separated list of stages"
      deep_check=$2
      shift 2
      ;;
    --genconf) genconf=1; shift ;;
    --prometheus-textfile)
      shift
      textfile_dir=$textfile_default
      # DIR is the next argument unless that is an option or the package
      if [[ -n "${1:-}" && "$1" != -* && "$1" != *.deb && "$1" != *.rpm ]]; then
        textfile_dir=$1
        shift
      fi
      [[ "$textfile_dir" == /* && "$textfile_dir" != *[[:cntrl:]]* ]] \
        || die "--prometheus-textfile needs an absolute folder, not '$textfile_dir'"
      textfile_dir=${textfile_dir%/}
      ;;
    *) die "unknown option $1 (--help lists them)" ;;
  esac
done
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
  if [[ -n "$textfile_dir" ]]; then
    printf '\n[reporters.prometheus]\nenabled = true\ntextfile = %s\n' \
      "$(toml_str "$textfile_dir/hma.prom")"
  fi
  if [[ -n "${HMA_EXTRA_TOML:-}" ]]; then printf '\n%s\n' "$HMA_EXTRA_TOML"; fi
} > "$tmp/50-lifecycle.toml"

config=${HMA_CONFIG:-/etc/hma/hma.toml}
dropins=$(dirname "$config")/hma.d
dropin=$dropins/50-lifecycle.toml
mkdir -p "$dropins"
[[ ! -e "$dropin" ]] || cp -p "$dropin" "$tmp/previous.toml"
install -m 0644 "$tmp/50-lifecycle.toml" "$dropin"
if ! hma --config "$config" config check; then
  if [[ -e "$tmp/previous.toml" ]]; then cp -p "$tmp/previous.toml" "$dropin"; else rm -f "$dropin"; fi
  die "the configuration above is invalid; $dropin left as it was"
fi
if [[ -n "$textfile_dir" ]]; then
  install -d -m 0755 "$textfile_dir"
  if [[ "$textfile_dir" != "$textfile_default" ]]; then  # the packaged unit may write only there
    unit_dropin=/etc/systemd/system/hma.service.d/50-textfile.conf
    mkdir -p "$(dirname "$unit_dropin")"
    printf '# Written by install_hma.sh: the Prometheus textfile folder.\n[Service]\nReadWritePaths=%s\n' \
      "$textfile_dir" > "$unit_dropin"
    log "wrote $unit_dropin (the agent may write $textfile_dir)"
  fi
  log "Prometheus textfile: $textfile_dir/hma.prom"
fi

# 2b. Record what the node has now (--genconf), checked like the settings.
if [[ "$genconf" == 1 ]]; then
  recorded=$dropins/50-genconf.toml
  if [[ -e "$recorded" || -L "$recorded" ]]; then
    log "kept $recorded, recorded before (delete it to record this node again)"
  else
    hma --config "$config" genconf --output "$recorded" || die "hma genconf failed (see above)"
    if ! hma --config "$config" config check; then
      rm -f "$recorded"
      die "the configuration with $recorded is invalid; the file is removed"
    fi
  fi
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
