#!/usr/bin/env bash
# The TRL peer's own interpreter (tools/trl_peer.py): a venv on top of this Python that reuses its torch (2.13.0
# CPU) and adds TRL 1.16.0 with the transformers 5 and numpy 2 it needs (pyarrow, under datasets, wants numpy 2),
# where mindgrpo's environment keeps transformers 4.57.1 (MindFormers pins it) and numpy<2 (MindSpore's).
# The benchmarks take its interpreter: `--vs-trl VENV/bin/python`.
#
#     bash tools/make_trl_venv.sh [VENV]        # VENV defaults to ./trlenv
set -euo pipefail
venv="${1:-trlenv}"
python="${PYTHON:-python}"
"$python" -c "import torch" 2>/dev/null || { echo "error: $python has no torch: pip install torch==2.13.0 first" >&2; exit 2; }
"$python" -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install --quiet "trl==1.16.0" "transformers==5.23.0" "numpy>=2,<3"
"$venv/bin/python" -c "import torch, transformers, trl; print(f'{trl.__version__=} {transformers.__version__=} {torch.__version__=}')"
echo "made $venv: pass --vs-trl $venv/bin/python to tools/bench_grpo.py or tools/bench_scaling.py"
