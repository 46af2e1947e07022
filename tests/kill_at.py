"""Run examples/grpo/main.py, SIGKILLing this process at the first event matching $MINDGRPO_KILL_AT (a regex).

Events are the steps by which runs write their files, described as ``<kind> <arguments>``:
``rename``/``replace`` (os.rename/os.replace: every commit of a checkpoint, an exported model, a JSON file or the
config), ``hash <file>`` (a checkpoint file being hashed for its manifest, after its part was written), ``rmtree``
(a pruned checkpoint being deleted) and ``append <file> <record>`` (a line of metrics.jsonl). The kill comes before
the event happens, exactly as a SIGKILL between two system calls. Used by tests/test_faults.py.
"""
import os
import re
import runpy
import shutil
import signal
import sys
from pathlib import Path

import mindgrpo  # noqa: F401
from mindgrpo.train import checkpoint
from mindgrpo.train import metrics

PATTERN = re.compile(os.environ["MINDGRPO_KILL_AT"]) if os.environ.get("MINDGRPO_KILL_AT") else None


def hooked(kind, fn):
    def call(*args, **kwargs):
        if PATTERN is not None and PATTERN.search(f"{kind} " + " ".join(map(str, args))):
            print(f"[kill_at] SIGKILL before: {kind} {' '.join(map(str, args))[:300]}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(*args, **kwargs)
    return call


os.rename = hooked("rename", os.rename)
os.replace = hooked("replace", os.replace)
shutil.rmtree = hooked("rmtree", shutil.rmtree)
checkpoint._hash_file = hooked("hash", checkpoint._hash_file)
metrics.MetricsLogger._append = hooked("append", metrics.MetricsLogger._append)  # described with self first

main = Path(__file__).resolve().parents[1] / "examples" / "grpo" / "main.py"
sys.argv = [str(main), *sys.argv[1:]]
runpy.run_path(str(main), run_name="__main__")
