#!/usr/bin/env python
"""What the vision tower costs a GRPO step: the VL demo's model against the text-only model of the same language size.

Workload: the embedded VL demo (:mod:`mindgrpo.apps.demo_vl`, without its warm start) — 8 pictures x 8 samples per
step, up to 8 new tokens — and the same language model, same weights, as a plain Qwen2 folder (the demo's text_config
and weights without ``visual.*``) on text prompts of the same token length (the 9 image tokens become digits,
different in every prompt as the pictures are: the engine prefills identical prompts once). The completions' mean
length is printed for both, since step time follows it. Each run is its own process (peak RSS is per process,
``ru_maxrss``), in GRAPH mode, precompiled; the figure is the mean of ``timing/all`` over the steps after the first.
For the VL run it also prints the tower's share of step time (``timing/vision`` / ``timing/all``) and the tower's
counter, which must equal steps x prompts: the tower runs once per prompt per step, not per sample or per forward.

    python tools/bench_vl.py [--steps 6]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def text_twin(demo, root: Path):
    """The demo's language model as a Qwen2 folder, and a text MindRecord whose prompts have the VL prompts'
    length."""
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    from mindgrpo.apps.demo_vl import MAX_PROMPT_LENGTH, PROMPT_TEMPLATE
    from mindgrpo.apps.demo_vl.task import QUESTION
    from mindgrpo.data import DataError, PromptDataset, convert_dataset
    from mindgrpo.data.tokenizer import load_tokenizer

    folder = root / "text_model"
    folder.mkdir()
    config = json.loads((demo.model_dir / "config.json").read_text(encoding="utf-8"))
    text = {**config["text_config"], "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
            "rope_scaling": None}
    (folder / "config.json").write_text(json.dumps(text), encoding="utf-8")
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        shutil.copyfile(demo.model_dir / name, folder / name)
    weights = load_file(str(demo.model_dir / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if not k.startswith("visual.")}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    vl = PromptDataset(demo.dataset_file)
    tok = load_tokenizer(folder)
    target = int(vl.lengths[0])
    filler = 9
    digits = np.random.default_rng(0).integers(0, 10, size=(len(vl), 64))
    for _ in range(40):  # digits (one token each) in place of the picture, different in every prompt (as the
        #                  pictures are: the engine prefills identical prompts once), until the text prompt is as long
        rows = [{"question": QUESTION.replace("<image>", "".join(map(str, digits[i, :filler])) + " "),
                 "answer": f"#### {gold}"} for i, gold in enumerate(vl.golds)]
        (root / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        out = root / "text.mindrecord"
        try:
            convert_dataset(root / "text.jsonl", out, tok, dataset_type="gsm8k", prompt_template=PROMPT_TEMPLATE,
                            max_prompt_length=MAX_PROMPT_LENGTH, progress=False, overwrite=True)
        except DataError:
            break
        length = int(PromptDataset(out).lengths[0])
        if length >= target:
            break
        filler += target - length
    return folder, out, target, length


def child(kind: str, model_dir: str, dataset: str, out: str, steps: int) -> None:
    import resource

    import numpy as np

    from mindgrpo.apps.demo_vl import VLDemo, demo_config
    from mindgrpo.train.trainer import GRPOTrainer

    cfg = demo_config(VLDemo(Path(out), Path(model_dir), Path(dataset)), Path(out) / f"run_{kind}", steps=steps)
    cfg.rl_config.save_ckpt_interval = 0
    if kind == "text":
        cfg.reward_config.verifier_function = ["accuracy_reward"]
    trainer = GRPOTrainer(cfg)
    trainer.precompile()
    rows = [trainer.train_step() for _ in range(steps)]
    vision = trainer.worker.actor.vision
    result = {"seconds_per_step": float(np.mean([r["timing/all"] for r in rows[1:]])),
              "vision_seconds_per_step": float(np.mean([r["timing/vision"] for r in rows[1:]])),
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "prompt_length": float(rows[-1]["prompt_length/mean"]),
              "response_length": float(np.mean([r["response_length/mean"] for r in rows[1:]])),
              "prompts_embedded": vision.prompts_embedded if vision is not None else None,
              "expected_embedded": steps * cfg.rl_config.batch_size}
    print("RESULT " + json.dumps(result), flush=True)


def run_child(kind: str, model_dir: Path, dataset: Path, out: Path, steps: int) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", kind, str(model_dir), str(dataset), str(out),
                           "--steps", str(steps)], capture_output=True, text=True, cwd=REPO)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{kind} run failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--child", nargs=4, metavar=("KIND", "MODEL", "DATA", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    if args.child:
        child(*args.child, steps=args.steps)
        return
    from mindgrpo.apps.demo_vl import make_vl_demo

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        demo = make_vl_demo(root / "demo", warm_start_steps=0)
        text_model, text_data, vl_length, text_length = text_twin(demo, root)
        vl = run_child("vl", demo.model_dir, demo.dataset_file, root, args.steps)
        text = run_child("text", text_model, text_data, root, args.steps)
    print(f"prompt tokens: VL {vl_length}, text {text_length}; {args.steps} steps of 8 prompts x 8 samples, GRAPH")
    print(f"completion tokens (mean): VL {vl['response_length']:.2f}, text {text['response_length']:.2f}")
    print(f"seconds/step: VL {vl['seconds_per_step']:.3f}, text {text['seconds_per_step']:.3f}, "
          f"ratio {vl['seconds_per_step'] / text['seconds_per_step']:.2f}x")
    print(f"peak RSS MiB: VL {vl['peak_rss_mib']:.0f}, text {text['peak_rss_mib']:.0f}, "
          f"ratio {vl['peak_rss_mib'] / text['peak_rss_mib']:.2f}x")
    print(f"vision tower: {vl['vision_seconds_per_step']:.3f} s/step, "
          f"{vl['vision_seconds_per_step'] / vl['seconds_per_step']:.1%} of the VL step")
    ok = vl["prompts_embedded"] == vl["expected_embedded"]
    print(f"tower calls: {vl['prompts_embedded']} prompts embedded for {vl['expected_embedded']} prompt-steps "
          f"({'once per prompt per step' if ok else 'MISMATCH'})")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
