"""The embedded demo: a tiny Qwen2.5-architecture model, its tokenizer and a GSM8K-format task, made locally.

`make_demo(out_dir)` builds everything the README's first command needs, without downloading anything
(`python -m mindgrpo.apps.demo [OUT_DIR]` does the same from the shell). One module per piece:

- `problems`: one-digit addition and subtraction word problems ("Tom has 3 apples and buys 4 more. How many
  apples does Tom have now?") in GSM8K format; 2,000 train and 200 test rows, no question in both.
- `tokenizer`: a Qwen2-format byte-level BPE trained on those rows in every prompt template, written as Qwen2.5
  ships its tokenizer files.
- `model`: Qwen2 (hidden 64, 2 layers, 4 heads, 2 KV heads, tied embeddings, ~128k parameters) initialised as
  Hugging Face does.
- `warm_start`: a short supervised fine-tuning in MindSpore on `gsm8k_hash` prompts -> answers, so GRPO starts
  with some reward signal and room to improve; `scoring` measures the model's greedy and sampled accuracy.
- `assets`: `make_demo` itself: the build in a temporary folder renamed into place, the `demo.json` stamp that
  makes a second call return at once, and the lock that lets one process build while the others wait.
"""
from mindgrpo.apps.demo.assets import (DEFAULT_WARM_START_STEPS, MODEL_FILES, RECIPE_VERSION, STAMP, DemoAssets,
                                       default_demo_dir, make_demo)
from mindgrpo.apps.demo.problems import NUM_TEST, NUM_TRAIN, make_problems
from mindgrpo.apps.demo.scoring import MAX_NEW_TOKENS, SEQ_LENGTH, answer_accuracy
from mindgrpo.apps.demo.tokenizer import SPECIAL_TOKENS, VOCAB_SIZE
from mindgrpo.apps.demo.warm_start import TARGET_MATCH

__all__ = ["DEFAULT_WARM_START_STEPS", "MAX_NEW_TOKENS", "MODEL_FILES", "NUM_TEST", "NUM_TRAIN", "RECIPE_VERSION",
           "SEQ_LENGTH", "SPECIAL_TOKENS", "STAMP", "TARGET_MATCH", "VOCAB_SIZE", "DemoAssets", "answer_accuracy",
           "default_demo_dir", "make_demo", "make_problems"]
