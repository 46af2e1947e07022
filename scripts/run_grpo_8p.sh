#!/usr/bin/env bash
# Launch GRPO on 8 workers (8 x Ascend 910B, or 8 CPU data-parallel ranks) with msrun.
#
#   bash scripts/run_grpo_8p.sh CONFIG.yaml [main.py flags and group.key=value overrides...]
#
# Environment: WORKERS (default 8), MASTER_PORT (default: a free port, so two jobs on one host never clash),
# LOG_DIR (default output/msrun_log). The config's parallel_config products must equal WORKERS.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: bash scripts/run_grpo_8p.sh CONFIG.yaml [flags] [group.key=value ...]" >&2
  exit 2
fi
CONFIG=$1; shift
[ -f "$CONFIG" ] || { echo "error: config file not found: $CONFIG" >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORKERS=${WORKERS:-8}
PYTHON=${PYTHON:-python}
MASTER_PORT=${MASTER_PORT:-$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
LOG_DIR=${LOG_DIR:-output/msrun_log}
command -v msrun >/dev/null || { echo "error: msrun not found; it comes with mindspore (pip install -e $HERE)" >&2; exit 2; }
echo "msrun: $WORKERS workers, master 127.0.0.1:$MASTER_PORT, logs in $LOG_DIR"
exec msrun --worker_num="$WORKERS" --local_worker_num="$WORKERS" --master_addr=127.0.0.1 \
  --master_port="$MASTER_PORT" --log_dir="$LOG_DIR" --join=True \
  "$HERE/examples/grpo/main.py" --config "$CONFIG" "$@"
