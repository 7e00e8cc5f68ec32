#!/usr/bin/env bash
# Restart time of two builds, alternated: seconds from exec to the first answered modelService
# query (the views read from their saved files), and the server's anonymous resident memory
# then (RssAnon), ROUNDS times each. Both run on DATA_DIR, or the old build on OLD_DATA_DIR
# when its saved views are in another format (a copy of the same store, started once by the
# old build so that it saved its own). Each directory needs a user `lt` with password `lt`
# (`geoshard user add`).
#
#   loadtest/restart-ab.sh OLD_BINARY NEW_BINARY DATA_DIR [ROUNDS] [OLD_DATA_DIR]
set -euo pipefail
A=$1 B=$2 DATA=$3 ROUNDS=${4:-3} OLD_DATA=${5:-$3}
ADDR=127.0.0.1:18098
once() {
  local start code pid took
  start=$(date +%s.%N)
  "$1" serve --data-dir "$2" --listen $ADDR > "${TMPDIR:-/tmp}/restart-ab.log" 2>&1 &
  pid=$!
  while :; do
    code=$(curl -s --digest -u lt:lt -o /dev/null -w '%{http_code}' "http://$ADDR/v1/resources/modelService" || true)
    [ "$code" = 200 ] && break
    kill -0 $pid 2> /dev/null || { tail -5 "${TMPDIR:-/tmp}/restart-ab.log"; exit 1; }
    sleep 0.01
  done
  took=$(echo "$(date +%s.%N) - $start" | bc)
  echo "$took s, RssAnon $(awk '/RssAnon/ {print $2, $3}' /proc/$pid/status)"
  kill -TERM $pid
  wait $pid || true
}
for _ in $(seq "$ROUNDS"); do
  echo "old $(once "$A" "$OLD_DATA")"
  echo "new $(once "$B" "$DATA")"
done
