#!/usr/bin/env bash
# Installs the migrator as the systemd service `migrator` (as root, after `bash .ci/install`):
# writes /etc/systemd/system/migrator.service from scripts/migrator.service with this checkout's
# path, creates /etc/default/migrator (MIGRATOR_* settings) when it does not exist, then enables
# and starts the service. `--print` only prints the unit it would install.
set -euo pipefail
checkout="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
unit="$(sed "s#@CHECKOUT@#${checkout}#g" "$checkout/scripts/migrator.service")"
if [ "${1:-}" = "--print" ]; then
  printf '%s\n' "$unit"
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "install-service: run as root" >&2; exit 1; }
[ -x "$checkout/node_modules/.bin/bun" ] || { echo "install-service: run 'bash .ci/install' first" >&2; exit 1; }
printf '%s\n' "$unit" >/etc/systemd/system/migrator.service
if [ ! -e /etc/default/migrator ]; then
  cat >/etc/default/migrator <<'CONF'
# MIGRATOR_* settings of the migrator service, one VAR=value per line (docs/configuration.md).
# The API is on the unix socket /run/migrator/api.sock (root:MIGRATOR_SOCKET_GROUP 0660).
# MIGRATOR_SOCKET_GROUP=root
# An optional TCP listener; every request on it needs the token of /var/lib/migrator/api-token.
# MIGRATOR_LISTEN=127.0.0.1:8080
# MIGRATOR_SINK=zvol
# MIGRATOR_ZFS_POOL=tank
CONF
  chmod 0600 /etc/default/migrator
fi
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  systemctl enable --now migrator
  systemctl --no-pager status migrator | head -5 || true
else
  echo "install-service: unit written; systemd is not running here, start it with: systemctl enable --now migrator"
fi
