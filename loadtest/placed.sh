# Sourced by the placement scripts after `start_nats`. start_placed NAME [VAR=VALUE...]: three
# nodes of cluster NAME holding four of six shards each (every shard on two nodes, H3
# resolution 2) and a single node holding everything, the extra environment given to each;
# the counties and places-1m loaded into the cluster (through node 1) and into the single
# node, every node caught up. Sets addr[1..3], pid[1..3], single and single_pid, and writes
# the cluster's status to $work/status. Needs $bin, $lt, $work, $urls and $pids.
applied() { curl -s "http://$1/ready" | python3 -c 'import json,sys; print(json.load(sys.stdin)["cluster"]["applied"])'; }

# start_node DIR ENV [NODE HOLD]: a single node, or node NODE of the cluster holding HOLD of
# six shards, with the environment ENV (an array's name); sets $node_pid and $node_addr.
start_node() {
  "$bin" user add --data-dir "$1" --name bench --password bench --role admin > /dev/null
  local -n extra=$2
  local mode=()
  [ -n "${3:-}" ] && mode=(--cluster "$urls" --node "$3" --cluster-shards 6 --hold "$4")
  env "${extra[@]}" GEOSHARD_CLUSTER_RESOLUTION=2 GEOSHARD_ACCESS_LOG=false GEOSHARD_LOG=warn \
    "$bin" serve --data-dir "$1" --listen 127.0.0.1:0 "${mode[@]}" > "$1.out" 2> "$1.err" &
  node_pid=$!
  pids+=("$node_pid")
  until grep -q listening "$1.out" 2> /dev/null; do sleep 0.05; done
  node_addr=$(sed -n 's/.*http:\/\///p' "$1.out")
}

declare -a addr pid
start_placed() {
  local name=$1 i a
  shift
  local node_env=(GEOSHARD_CLUSTER_NAME="$name" "$@")
  local holds=("" "0,1,2,3" "2,3,4,5" "4,5,0,1")
  for i in 1 2 3; do
    start_node "$work/node$i" node_env "node$i" "${holds[$i]}"
    pid[$i]=$node_pid
    addr[$i]=$node_addr
  done
  start_node "$work/single" node_env
  single_pid=$node_pid
  single=$node_addr
  for a in "${addr[1]}" "$single"; do
    "$lt" prepare --addr "$a" --user bench --password bench --dataset counties --batch 200
    "$lt" prepare --addr "$a" --user bench --password bench --dataset places-1m --batch 5000
  done
  local target
  target=$(applied "${addr[1]}")
  for i in 2 3; do
    until [ "$(applied "${addr[$i]}")" -ge "$target" ]; do sleep 0.5; done
  done
  sleep 3 # every node has read the others' registry entries
  "$bin" cluster status --cluster "$urls" --name "$name" | tee "$work/status"
}
