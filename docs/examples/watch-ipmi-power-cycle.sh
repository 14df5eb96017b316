#!/bin/sh
# Reboot hook for `hma watch` (docs/watch.md): power-cycle a node that no longer answers, through
# its BMC (IPMI over LAN). In the controller's hma.toml:
#
#   [recovery]
#   reboot_command = ["/usr/share/doc/hma/examples/watch-ipmi-power-cycle.sh"]
#   command_timeout = 120
#
# HMA_NODE names the node, HMA_ACTION_ID the action (the same on every retry: a retry of an action
# this hook already carried out does nothing). The BMC's address is "<node>-bmc" unless
# HMA_BMC_SUFFIX says otherwise; its user and password file are HMA_IPMI_USER and
# HMA_IPMI_PASSWORD_FILE (set them in a drop-in of hma-watch.service, Environment=). Every call has
# a timeout; exit 0 only when the BMC took the power cycle.
set -eu

[ "${HMA_ACTION:-}" = reboot ] || { echo "only reboots: HMA_ACTION=${HMA_ACTION:-}" >&2; exit 2; }
case "${HMA_NODE:-}" in
    ''|*[!A-Za-z0-9._-]*) echo "unusable node name" >&2; exit 2 ;;
esac
case "${HMA_ACTION_ID:-}" in
    ''|*[!A-Za-z0-9._-]*) echo "unusable action id" >&2; exit 2 ;;
esac

done_dir=${HMA_HOOK_DONE_DIR:-/var/lib/hma/watch/hooks}
mkdir -p "$done_dir"
if [ -e "$done_dir/$HMA_ACTION_ID" ]; then
    echo "$HMA_ACTION_ID already carried out"
    exit 0
fi

bmc="${HMA_NODE}${HMA_BMC_SUFFIX:--bmc}"
timeout 60 ipmitool -I lanplus -H "$bmc" -U "${HMA_IPMI_USER:-admin}" \
    -f "${HMA_IPMI_PASSWORD_FILE:-/etc/hma/ipmi.password}" chassis power cycle
touch "$done_dir/$HMA_ACTION_ID"
