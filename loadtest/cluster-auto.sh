#!/bin/bash
# Shards placed automatically, through a join and a loss, under query load. Three NATS servers
# and three nodes with cluster_placement = "auto" (six shards, two holders each), counties and
# places-1m loaded through node 1, and a single node loaded alike. Queries run in
# back-to-back windows of WINDOW seconds, pip-counties and envelope in turn, spread over the
# nodes, every answer of CHECKED a window checked against the dataset. After BEFORE windows
# a fourth node starts on an empty data directory and takes its share of the shards (copied
# in from their holders, its views built again) while the others answer; once the shards
# are settled (two holders each, nothing moving), AFTER windows; then node 2 is killed
# (SIGKILL) for good, and its shards are copied to the others from the survivors once its
# lease is over; once settled again, AFTER more windows. CATCH_UP: every node's
# cluster_catch_up_bytes, which paces the log while catching up and the copying in of
# shards taken (0: as fast as it can).
#
# Results: $work/windows.jsonl, loadtest/reports/NAME.md and NAME.svg. Needs nats-server
# (scripts/setup-system.sh). Usage: loadtest/cluster-auto.sh NAME
set -euo pipefail
cd "$(dirname "$0")/.."
source loadtest/nats.sh
source loadtest/placed.sh
name=${1:?usage: loadtest/cluster-auto.sh NAME}
WINDOW=${WINDOW:-3}
BEFORE=${BEFORE:-6}
AFTER=${AFTER:-6}
CONNS=${CONNS:-8}
CATCH_UP=${CATCH_UP:-0}
cluster_work cluster-auto

start_nats 14530 auto
start_placed auto GEOSHARD_CLUSTER_PLACEMENT=auto GEOSHARD_CLUSTER_CATCH_UP_BYTES="$CATCH_UP"

t0=$(date +%s.%N)
n=0
for _ in $(seq "$BEFORE"); do window before "${addr[1]}" "${addr[2]}" "${addr[3]}"; done
joined=$(now)
node4_env=(GEOSHARD_CLUSTER_NAME=auto GEOSHARD_CLUSTER_PLACEMENT=auto
  GEOSHARD_CLUSTER_CATCH_UP_BYTES="$CATCH_UP")
start_node "$work/node4" node4_env node4 auto
addr[4]=$node_addr
until settled "${addr[1]}" 4; do
  window joining "${addr[1]}" "${addr[2]}" "${addr[3]}"
done
balanced=$(now)
for _ in $(seq "$AFTER"); do window joined "${addr[1]}" "${addr[2]}" "${addr[3]}" "${addr[4]}"; done
"$bin" cluster status --cluster "$urls" --name auto > "$work/status-joined"
killed=$(now)
kill -9 "${pid[2]}"
until settled "${addr[1]}" 3; do
  window losing "${addr[1]}" "${addr[3]}" "${addr[4]}"
done
restored=$(now)
for _ in $(seq "$AFTER"); do window lost "${addr[1]}" "${addr[3]}" "${addr[4]}"; done
"$bin" cluster status --cluster "$urls" --name auto > "$work/status-lost"
du -sb "$work"/node{1,2,3,4} "$work/single" > "$work/du"
cat > "$work/intro.md" << 'END'
# Shards placed automatically through a join and a loss, under query load

Command: `COMMAND`. Three nodes with `cluster_placement = "auto"` (six shards, two holders
each), counties and places-1m; a fourth node starts on an empty data directory and takes its
share, then node 2 is killed for good. Queries run meanwhile in back-to-back windows,
pip-counties and envelope in turn, spread over the live nodes, a share of every window's
answers checked. "Settled": every shard served by two nodes, nothing being taken or let go.

END
python3 loadtest/cluster-join-report.py "$work" "$name" \
  "CATCH_UP=$CATCH_UP loadtest/cluster-auto.sh $name" \
  "$joined=node 4 starts" "$balanced=settled over 4" "$killed=node 2 killed" \
  "$restored=settled over 3" > "loadtest/reports/$name.md"
cat "loadtest/reports/$name.md"
