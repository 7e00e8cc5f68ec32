#!/bin/bash
# Disk per node with partitioned storage: three NATS servers, three nodes holding four of six
# shards each (every shard on two nodes) and a single node holding everything, counties and
# places-1m loaded into both (loadtest/placed.sh). The nodes are stopped (saving their views),
# then each data directory is measured as it is and after `geoshard compact`, which packs the
# store (redb files grow in steps, so their size as written says little).
#
# Results: loadtest/reports/NAME.md. Needs nats-server (scripts/setup-system.sh).
# Usage: loadtest/cluster-disk.sh NAME
set -euo pipefail
cd "$(dirname "$0")/.."
source loadtest/nats.sh
source loadtest/placed.sh
name=${1:?usage: loadtest/cluster-disk.sh NAME}
out=loadtest/reports/$name
cluster_work cluster-disk

start_nats 14330 disk
start_placed disk
for p in "${pid[@]}" "$single_pid"; do kill -TERM "$p"; done
for p in "${pid[@]}" "$single_pid"; do while kill -0 "$p" 2> /dev/null; do sleep 0.2; done; done

bytes() { du -sb "$1" | cut -f1; }
{
  echo "# Disk per node, partitioned storage ($(date -u +%F))"
  echo
  echo "Command: \`loadtest/cluster-disk.sh $name\`. Counties and places-1m; three nodes holding"
  echo "four of six shards each (every shard on two nodes) against one node holding all."
  echo
  echo "| node | data dir as written | store packed | data dir packed | against the single node (packed dir) |"
  echo "|---|---|---|---|---|"
} > "$out.md"
declare -A written packed store
for d in single node1 node2 node3; do
  written[$d]=$(bytes "$work/$d")
  "$bin" compact --data-dir "$work/$d" > /dev/null
  store[$d]=$(stat -c %s "$work/$d/geoshard.redb")
  packed[$d]=$(bytes "$work/$d")
done
for d in single node1 node2 node3; do
  ratio=$(python3 -c "print(f'{${packed[$d]} / ${packed[single]}:.3f}')")
  echo "| $d | $((written[$d] / 1000000)) MB | $((store[$d] / 1000000)) MB | $((packed[$d] / 1000000)) MB | ${ratio}× |" >> "$out.md"
done
cat "$out.md"
