#!/usr/bin/env bash
# Restart time of two builds on one data directory, alternated: seconds from exec to the first
# answered modelService query (the views read from their saved files), ROUNDS times each. The
# directory needs a user `lt` with password `lt` (`geoshard user add`).
#
#   loadtest/restart-ab.sh OLD_BINARY NEW_BINARY DATA_DIR [ROUNDS]
set -euo pipefail
A=$1 B=$2 DATA=$3 ROUNDS=${4:-3}
ADDR=127.0.0.1:18098
once() {
  local start code pid
  start=$(date +%s.%N)
  "$1" serve --data-dir "$DATA" --listen $ADDR > "${TMPDIR:-/tmp}/restart-ab.log" 2>&1 &
  pid=$!
  while :; do
    code=$(curl -s --digest -u lt:lt -o /dev/null -w '%{http_code}' "http://$ADDR/v1/resources/modelService" || true)
    [ "$code" = 200 ] && break
    kill -0 $pid 2> /dev/null || { tail -5 "${TMPDIR:-/tmp}/restart-ab.log"; exit 1; }
    sleep 0.01
  done
  echo "$(date +%s.%N) - $start" | bc
  kill -TERM $pid
  wait $pid || true
}
for _ in $(seq "$ROUNDS"); do
  echo "old $(once "$A")"
  echo "new $(once "$B")"
done
