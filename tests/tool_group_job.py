"""msrun job for tests/test_tool_training.py: two ranks of one tensor-parallel group answer the same tool turn.
The tool answers with its worker's process id, which differs between ranks: both must read rank 0's answer, and
rank 1 must run no tool. Usage: msrun --worker_num=2 ... tool_group_job.py TOKENIZER_DIR"""
import json
import sys

import mindgrpo  # noqa: F401  (before MindSpore)
import mindspore as ms

from mindgrpo.data.tokenizer import load_tokenizer
from mindgrpo.parallel.groups import init_distributed
from mindgrpo.tools import ToolRunner, ToolTurns, resolve_tools

ms.set_context(device_target="CPU")
dist = init_distributed(model_parallel=2)
tokenizer = load_tokenizer(sys.argv[1])
runner = ToolRunner(resolve_tools(["tool_examples:whoami"]), processes=1, timeout=30)
turns = ToolTurns(tokenizer, runner, max_turns=1, max_response_tokens=32, dist=dist)
call = tokenizer.encode('<tool_call>\n{"name": "whoami", "arguments": {}}\n</tool_call><|im_end|>')
plain = tokenizer.encode("no call<|im_end|>")
answers = turns.respond([plain, call, call], [1, 1, 2])
print("ANSWERS " + json.dumps({"rank": dist.rank, "answers": answers, "workers": len(runner.pool._workers),
                               "stats": turns.take_stats()}), flush=True)
runner.close()
