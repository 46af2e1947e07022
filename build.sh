#!/usr/bin/env bash
# Build mindgrpo: compile the CPU kernels (fused GRPO loss, rollout decode step) into the kernel cache, then build the
# wheel into dist/.
#
#   ./build.sh            # PYTHON=python3.11 ./build.sh to pick the interpreter
#
# The kernels land in mindgrpo's cache (~/.cache/mindgrpo/kernels, or $MINDGRPO_CACHE/kernels) under a name keyed by
# a hash of its source, the compiler and the flags, so a changed source is rebuilt and never loaded stale. The wheel
# ships the kernel sources (mindgrpo/ops/kernels/), not the compiled library: each machine compiles on first use
# (or runs this script / `python -m mindgrpo.ops`). The Ascend C operators are built on an Ascend host with
# `python -m mindgrpo.ops --ascend` (needs CANN); this script does not attempt that.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
PYTHON="${PYTHON:-python}"
# Use this checkout's package even when another mindgrpo is installed.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

echo "==> compiling the CPU kernels"
"$PYTHON" -m mindgrpo.ops

echo "==> building the wheel into dist/"
# setuptools stages files in build/ and never prunes it: a stale copy would ship files deleted from the source.
rm -rf build
# No build isolation: setuptools is already here, and isolation would need network access to fetch it.
"$PYTHON" -m pip wheel . --no-deps --no-build-isolation --wheel-dir dist

echo "==> done"
ls -1 dist/*.whl
