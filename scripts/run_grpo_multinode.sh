#!/usr/bin/env bash
# Launch GRPO on several servers with msrun's multi-node form: run this once on every server, each with its own
# NODE_RANK and all with the same MASTER_ADDR (server 0's address) and MASTER_PORT. Recipe: docs/multinode.md.
#
#   bash scripts/run_grpo_multinode.sh CONFIG.yaml NODE_RANK MASTER_ADDR [NODES [WORKERS_PER_NODE]] \
#       [main.py flags and group.key=value overrides...]
#
# NODES defaults to 2 and WORKERS_PER_NODE to 8 (one per NPU); the job has NODES x WORKERS_PER_NODE workers, and
# the config's data_parallel x model_parallel must equal that. Ranks are numbered server by server (node 0 holds
# ranks 0..WORKERS_PER_NODE-1), so a model_parallel group of up to WORKERS_PER_NODE consecutive ranks stays inside
# one server. Environment: MASTER_PORT (default 8118, msrun's own; it must be the same on every server and free on
# server 0), LOG_DIR (default output/msrun_log_node<NODE_RANK>), CLUSTER_TIME_OUT (seconds a server waits for the
# others to join, default 600), PYTHON.
set -euo pipefail
usage() {
  echo "usage: bash scripts/run_grpo_multinode.sh CONFIG.yaml NODE_RANK MASTER_ADDR [NODES [WORKERS_PER_NODE]]" \
       "[flags] [group.key=value ...]" >&2
  exit 2
}
is_count() { [[ $1 =~ ^[0-9]+$ ]]; }
[ $# -ge 3 ] || usage
CONFIG=$1 NODE_RANK=$2 MASTER_ADDR=$3
shift 3
NODES=2 WORKERS_PER_NODE=8
if [ $# -gt 0 ] && is_count "$1"; then NODES=$1; shift; fi
if [ $# -gt 0 ] && is_count "$1"; then WORKERS_PER_NODE=$1; shift; fi
[ -f "$CONFIG" ] || { echo "error: config file not found: $CONFIG" >&2; exit 2; }
is_count "$NODE_RANK" || { echo "error: NODE_RANK must be a number, got '$NODE_RANK'" >&2; usage; }
[ "$NODES" -ge 1 ] && [ "$WORKERS_PER_NODE" -ge 1 ] || { echo "error: NODES and WORKERS_PER_NODE must be >= 1" >&2; exit 2; }
[ "$NODE_RANK" -lt "$NODES" ] || { echo "error: NODE_RANK $NODE_RANK is not below NODES $NODES" >&2; exit 2; }
[ -n "$MASTER_ADDR" ] || { echo "error: MASTER_ADDR is empty: give server 0's IP address or host name" >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MASTER_PORT=${MASTER_PORT:-8118}
LOG_DIR=${LOG_DIR:-output/msrun_log_node$NODE_RANK}
CLUSTER_TIME_OUT=${CLUSTER_TIME_OUT:-600}
WORKERS=$((NODES * WORKERS_PER_NODE))
command -v msrun >/dev/null || { echo "error: msrun not found; it comes with mindspore (pip install -e $HERE)" >&2; exit 2; }
FIRST=$((NODE_RANK * WORKERS_PER_NODE))
echo "msrun: node $NODE_RANK of $NODES, ranks $FIRST..$((FIRST + WORKERS_PER_NODE - 1)) of $WORKERS," \
     "master $MASTER_ADDR:$MASTER_PORT, logs in $LOG_DIR"
exec msrun --worker_num="$WORKERS" --local_worker_num="$WORKERS_PER_NODE" --node_rank="$NODE_RANK" \
  --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" --log_dir="$LOG_DIR" --join=True \
  --cluster_time_out="$CLUSTER_TIME_OUT" \
  "$HERE/examples/grpo/main.py" --config "$CONFIG" "$@"
