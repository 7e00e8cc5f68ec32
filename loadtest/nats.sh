# Sourced by the cluster scripts. start_nats BASE NAME: three NATS servers routed into one
# JetStream cluster NAME on loopback (client ports BASE+1..3, route ports BASE+2001..2003,
# stores and logs under $work); adds their pids to $pids and sets $urls.
start_nats() {
  local base=$1 name=$2 nats i
  nats=$(command -v nats-server || echo /usr/sbin/nats-server)
  local routes="nats-route://127.0.0.1:$((base + 2001)), nats-route://127.0.0.1:$((base + 2002)), nats-route://127.0.0.1:$((base + 2003))"
  for i in 1 2 3; do
    cat > "$work/nats$i.conf" << EOF
port: $((base + i))
server_name: nats$i
max_payload: 8MB
jetstream { store_dir: "$work/js$i" }
cluster { name: $name, port: $((base + 2000 + i)), routes: [$routes] }
EOF
    "$nats" -c "$work/nats$i.conf" > "$work/nats$i.log" 2>&1 &
    pids+=($!)
  done
  urls=nats://127.0.0.1:$((base + 1)),nats://127.0.0.1:$((base + 2)),nats://127.0.0.1:$((base + 3))
}

# cluster_work NAME: a fresh work directory $work (${TMPDIR:-/tmp}/geoshard-NAME), the release
# binaries $bin and $lt built ($bin is BIN instead when set, to measure another build), and
# every pid in $pids killed on exit (then `more_cleanup`, when the script defines it).
cluster_work() {
  work=${TMPDIR:-/tmp}/geoshard-$1
  rm -rf "$work"
  mkdir -p "$work" loadtest/reports
  cargo build --release -q -p geoshard -p geoshard-loadtest
  bin=${BIN:-$PWD/target/release/geoshard}
  lt=$PWD/target/release/geoshard-loadtest
  pids=()
  trap cleanup EXIT
}
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  if declare -F more_cleanup > /dev/null; then more_cleanup; fi
}
