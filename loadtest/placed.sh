# Sourced by the placement scripts after `start_nats`. start_placed NAME [VAR=VALUE...]: three
# nodes of cluster NAME holding four of six shards each (every shard on two nodes, H3
# resolution 2) and a single node holding everything, the extra environment given to each;
# the counties and places-1m loaded into the cluster (through node 1) and into the single
# node, every node caught up. Sets addr[1..3], pid[1..3], single and single_pid, and writes
# the cluster's status to $work/status. Needs $bin, $lt, $work, $urls and $pids.
applied() { curl -s "http://$1/ready" | python3 -c 'import json,sys; print(json.load(sys.stdin)["cluster"]["applied"])'; }

# start_node DIR ENV [NODE HOLD]: a single node, or node NODE of the cluster holding HOLD of
# six shards (`auto`: placed automatically, GEOSHARD_CLUSTER_PLACEMENT=auto in ENV), with
# the environment ENV (an array's name); sets $node_pid and $node_addr.
start_node() {
  "$bin" user add --data-dir "$1" --name bench --password bench --role admin > /dev/null
  local -n extra=$2
  local mode=()
  [ -n "${3:-}" ] && mode=(--cluster "$urls" --node "$3" --cluster-shards 6 --hold "$4")
  [ "${4:-}" = auto ] && mode=(--cluster "$urls" --node "$3" --cluster-shards 6)
  env "${extra[@]}" GEOSHARD_CLUSTER_RESOLUTION=2 GEOSHARD_ACCESS_LOG=false GEOSHARD_LOG=warn \
    "$bin" serve --data-dir "$1" --listen 127.0.0.1:0 "${mode[@]}" > "$1.out" 2> "$1.err" &
  node_pid=$!
  pids+=("$node_pid")
  until grep -q listening "$1.out" 2> /dev/null; do sleep 0.05; done
  node_addr=$(sed -n 's/.*http:\/\///p' "$1.out")
}

# settled ADDR N: whether GET /v1/cluster through ADDR shows N nodes, every shard served by
# two, nothing being taken or let go.
settled() {
  curl -s --digest -u bench:bench "http://$1/v1/cluster" | python3 -c "
import json, sys
v = json.load(sys.stdin)
nodes = v['nodes']
ok = len(nodes) == $2 and all(n['state'] == 'serving' and not n['taking'] and not n['letting_go'] for n in nodes)
ok = ok and all(sum(s in (n['shards'] or []) for n in nodes) == 2 for s in range(6))
sys.exit(0 if ok else 1)"
}

declare -a addr pid
# quiet PID...: wait (up to 10 minutes) until none of the processes used more than 5% of a core
# over the last 2 s: a save of the views after a load would otherwise run under the
# measurements, and under a CPU quota it takes a while.
quiet() {
  local p t0 t1 busy i deadline=$((SECONDS + 600))
  while [ "$SECONDS" -lt "$deadline" ]; do
    t0=()
    for p in "$@"; do t0+=("$(awk '{print $14 + $15}' "/proc/$p/stat")"); done
    sleep 2
    busy=0 i=0
    for p in "$@"; do
      t1=$(awk '{print $14 + $15}' "/proc/$p/stat")
      [ $((t1 - t0[i])) -gt 10 ] && busy=1
      i=$((i + 1))
    done
    [ "$busy" = 0 ] && return 0
  done
  echo "still busy after 10 minutes: $*" >&2
}

start_placed() {
  local name=$1 i a
  shift
  local node_env=(GEOSHARD_CLUSTER_NAME="$name" "$@")
  local holds=("" "0,1,2,3" "2,3,4,5" "4,5,0,1")
  # Placed automatically: the nodes place the shards themselves.
  [[ " $* " == *" GEOSHARD_CLUSTER_PLACEMENT=auto "* ]] && holds=("" auto auto auto)
  for i in 1 2 3; do
    start_node "$work/node$i" node_env "node$i" "${holds[$i]}"
    pid[$i]=$node_pid
    addr[$i]=$node_addr
  done
  local single_env=()
  for a in "${node_env[@]}"; do
    [ "$a" = GEOSHARD_CLUSTER_PLACEMENT=auto ] || single_env+=("$a")
  done
  start_node "$work/single" single_env
  single_pid=$node_pid
  single=$node_addr
  if [ "${holds[1]}" = auto ]; then
    until settled "${addr[1]}" 3; do sleep 0.5; done
  fi
  for a in "${addr[1]}" "$single"; do
    "$lt" prepare --addr "$a" --user bench --password bench --dataset counties --batch 200
    "$lt" prepare --addr "$a" --user bench --password bench --dataset places-1m --batch 5000
  done
  local target
  target=$(applied "${addr[1]}")
  for i in 2 3; do
    until [ "$(applied "${addr[$i]}")" -ge "$target" ]; do sleep 0.5; done
  done
  # Every node has read the others' registry entries, and saved its views (due up to
  # view_save_secs, 60 s, after the load), before anything is measured.
  sleep 61
  quiet "${pid[1]}" "${pid[2]}" "${pid[3]}" "$single_pid"
  "$bin" cluster status --cluster "$urls" --name "$name" | tee "$work/status"
}

# now: seconds since $t0. window PHASE ADDR...: one window of WINDOW seconds of queries
# (pip-counties and envelope in turn, CONNS connections, 200 answers checked) through the
# addresses given; its record with its phase and start time appended to
# $work/windows.jsonl. Needs $t0 and $n.
now() { python3 -c "import time; print(f'{time.time() - $t0:.2f}')"; }
window() {
  local phase=$1 w a start
  shift
  w=$([ $((n % 2)) -eq 0 ] && echo pip-counties || echo envelope)
  local also=()
  for a in "${@:2}"; do also+=(--also "$a"); done
  start=$(now)
  "$lt" run --workload "$w" --addr "$1" "${also[@]}" --user bench --password bench \
    --duration "$WINDOW" --warmup 0 --connections "$CONNS" --checked 200 \
    --out "$work/run.jsonl" > /dev/null
  tail -1 "$work/run.jsonl" | python3 -c "
import json, sys
r = json.load(sys.stdin)
r.update(phase='$phase', start=$start, window=$n)
print(json.dumps(r))" >> "$work/windows.jsonl"
  n=$((n + 1))
}
