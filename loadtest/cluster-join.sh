#!/bin/bash
# A node joins under query load. Three NATS servers and three nodes holding four of six shards
# each (every shard on two nodes), counties and places-1m loaded (loadtest/placed.sh). Queries
# run in back-to-back windows of WINDOW seconds, pip-counties and envelope in turn, spread
# over the nodes, every answer of CHECKED a window checked against the dataset. After BEFORE
# windows a fourth node starts on an empty data directory holding shards 1, 3 and 5: it copies
# them (the log, or a snapshot of a group keeping them) while the others answer, then is
# caught up and takes queries too, for AFTER more windows. CATCH_UP: its
# cluster_catch_up_bytes (0: as fast as it can).
#
# Results: $work/windows.jsonl, loadtest/reports/NAME.md and NAME.svg (cluster-join-report.py).
# Needs nats-server (scripts/setup-system.sh). Usage: loadtest/cluster-join.sh NAME
set -euo pipefail
cd "$(dirname "$0")/.."
source loadtest/nats.sh
source loadtest/placed.sh
name=${1:?usage: loadtest/cluster-join.sh NAME}
WINDOW=${WINDOW:-3}
BEFORE=${BEFORE:-6}
AFTER=${AFTER:-6}
CONNS=${CONNS:-8}
CATCH_UP=${CATCH_UP:-0}
cluster_work cluster-join

start_nats 14430 join
start_placed join

t0=$(date +%s.%N)
n=0
for _ in $(seq "$BEFORE"); do window before "${addr[1]}" "${addr[2]}" "${addr[3]}"; done
joined=$(now)
holds4="1,3,5"
node4_env=(GEOSHARD_CLUSTER_NAME=join GEOSHARD_CLUSTER_CATCH_UP_BYTES="$CATCH_UP")
start_node "$work/node4" node4_env node4 "$holds4"
addr[4]=$node_addr
until curl -sf "http://${addr[4]}/ready" > /dev/null; do
  window joining "${addr[1]}" "${addr[2]}" "${addr[3]}"
done
caught=$(now)
for _ in $(seq "$AFTER"); do window after "${addr[1]}" "${addr[2]}" "${addr[3]}" "${addr[4]}"; done
"$bin" cluster status --cluster "$urls" --name join > "$work/status-after"
du -sb "$work"/node{1,2,3,4} "$work/single" > "$work/du"
cat > "$work/intro.md" << 'END'
# A node joins under query load

Command: `COMMAND`. Three nodes holding four of six shards each (every shard on two
nodes), counties and places-1m; a fourth node starts on an empty data directory holding
shards 1, 3 and 5 while queries run in back-to-back windows, pip-counties and envelope in
turn, spread over the nodes, a share of every window's answers checked.

END
python3 loadtest/cluster-join-report.py "$work" "$name" \
  "CATCH_UP=$CATCH_UP loadtest/cluster-join.sh $name" \
  "$joined=node 4 starts" "$caught=node 4 caught up" > "loadtest/reports/$name.md"
cat "loadtest/reports/$name.md"
