"""Every MindRLHF flag of the flag table (docs/configuration.md) reaches the config key it names, and that key has its
effect on a built trainer (or the flag is refused: tests/test_preflight.py). Valid parts come from the embedded demo."""
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from mindgrpo.config import CLI_FLAGS, get_key, load_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_qwen import make_tiny_qwen2  # noqa: E402

FLAG_TABLE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

# A value for each flag as typed, and what its key then holds ({tmp} is the test's folder).
TYPED = {
    "dataset_file": ("{tmp}/d.mindrecord", "{tmp}/d.mindrecord"),
    "tokenizer_dir": ("{tmp}/tok", "{tmp}/tok"),
    "actor_checkpoint_path": ("{tmp}/actor", "{tmp}/actor"),
    "ref_checkpoint_path": ("{tmp}/ref", "{tmp}/ref"),
    "generate_checkpoint_path": ("{tmp}/gen", "{tmp}/gen"),
    "verifier_function": ("accuracy_reward,format_reward", ["accuracy_reward", "format_reward"]),
    "verifier_weight": ("1.0 0.5", [1.0, 0.5]),
    "save_checkpoint_dir": ("{tmp}/ckpt", "{tmp}/ckpt"),
    "resume_training": (None, True),
}


def test_typed_values_cover_every_flag():
    assert set(TYPED) == set(CLI_FLAGS)


@pytest.mark.parametrize("flag", list(CLI_FLAGS))
def test_flag_reaches_its_key(flag, tmp_path, monkeypatch):
    from mindgrpo.apps.train_cli import parse_args

    monkeypatch.chdir(tmp_path)
    typed, expected = TYPED[flag]
    argv = ["--config", "c.yaml", f"--{flag}"] + ([] if typed is None else [typed.format(tmp=tmp_path)])
    (tmp_path / "c.yaml").write_text("rl_config:\n  seed: 1\n", encoding="utf-8")
    args = parse_args(argv)
    config = load_config(args.config, args.overrides, {name: getattr(args, name) for name in CLI_FLAGS})
    if isinstance(expected, str):
        expected = expected.format(tmp=tmp_path)
    assert get_key(config, CLI_FLAGS[flag]) == expected


def test_flag_table_names_every_flag_and_its_key():
    """The flag table lists exactly load.py's flags, each with the key it sets."""
    rows = re.findall(r"^\| `--(\w+)` \| `([\w.]+)` \|", FLAG_TABLE.read_text(encoding="utf-8"), re.M)
    assert dict(rows) == CLI_FLAGS


@pytest.fixture(scope="module")
def flagged(tmp_path_factory, demo_plain, demo_prompts):
    """A trainer built from a command line that sets every flag to its own folder, stepped once and saved, and
    the same command line with --resume_training."""
    from mindgrpo.apps.train_cli import parse_args, run_inputs
    from mindgrpo.train.trainer import GRPOTrainer

    tmp = tmp_path_factory.mktemp("flags")
    tok = tmp / "tok"
    shutil.copytree(demo_plain.model_dir, tok, ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    marked = json.loads((tok / "tokenizer_config.json").read_text(encoding="utf-8"))
    marked["model_max_length"] = 4321  # only this tokenizer folder says so
    (tok / "tokenizer_config.json").write_text(json.dumps(marked), encoding="utf-8")
    hf = json.loads((demo_plain.model_dir / "config.json").read_text(encoding="utf-8"))
    ref = make_tiny_qwen2(tmp / "ref", heads=hf["num_attention_heads"], kv_heads=hf["num_key_value_heads"],
                          head_dim=hf["hidden_size"] // hf["num_attention_heads"], layers=hf["num_hidden_layers"],
                          intermediate=hf["intermediate_size"], vocab=hf["vocab_size"], seed=7)
    (tmp / "c.yaml").write_text(
        "rl_config:\n  mode: pynative\n  max_steps: 2\n  batch_size: 2\n  num_generations: 4\n"
        "  max_prompt_length: 64\n  seq_length: 80\n  beta: 0.04\n  output_dir: run\n"
        "actor_config:\n  micro_batch_size: 4\n  lr_schedule:\n    learning_rate: 1.0e-3\n"
        "ref_config:\n  ref_model_batch_size: 8\n"
        "generate_config:\n  infer_model_batch_size: 8\n  sampling_config:\n    max_tokens: 8\n", encoding="utf-8")
    argv = ["--config", str(tmp / "c.yaml"), "--dataset_file", str(demo_prompts), "--tokenizer_dir", str(tok),
            "--actor_checkpoint_path", str(demo_plain.model_dir), "--ref_checkpoint_path", str(ref),
            "--generate_checkpoint_path", str(demo_plain.model_dir),
            "--verifier_function", "accuracy_reward,hash_format_reward", "--verifier_weight", "1.0 0.25",
            "--save_checkpoint_dir", str(tmp / "ckpts")]
    trainer = GRPOTrainer(load_config(*run_inputs(parse_args(argv))))
    trainer.train_step()
    saved = trainer.save_checkpoint()
    trainer.metrics.close()
    trainer.scorer.close()
    resumed = GRPOTrainer(load_config(*run_inputs(parse_args(argv + ["--resume_training"]))))
    resumed.metrics.close()
    resumed.scorer.close()
    return dict(trainer=trainer, resumed=resumed, saved=saved, tmp=tmp, ref=ref, tok=tok)


def _weights(cell) -> dict:
    from mindgrpo.models import hf_parameters

    return {name: param.asnumpy() for name, param in hf_parameters(cell).items()}


def _folder_weights(folder: Path) -> dict:
    from mindgrpo.models.safetensors_io import SafetensorsReader

    reader = SafetensorsReader(folder / "model.safetensors")
    return {name: reader.read(name) for name in reader.keys()}


def test_model_flags_load_their_folders(flagged, demo_plain):
    """--actor_checkpoint_path is the actor's start; --ref_checkpoint_path (another model) is what the reference
    holds, not the actor's weights; --generate_checkpoint_path equal to the actor's folder is accepted."""
    trainer = flagged["trainer"]
    reference, ref_folder = _weights(trainer.worker.reference), _folder_weights(flagged["ref"])
    actor_start = _folder_weights(demo_plain.model_dir)
    assert reference.keys() == ref_folder.keys()
    for name, value in ref_folder.items():
        np.testing.assert_array_equal(reference[name], value, err_msg=name)
    assert not np.allclose(reference["model.embed_tokens.weight"], actor_start["model.embed_tokens.weight"])
    # resumed, the actor comes from the checkpoint but the frozen reference again from --ref_checkpoint_path
    again = _weights(flagged["resumed"].worker.reference)
    np.testing.assert_array_equal(again["model.norm.weight"], ref_folder["model.norm.weight"])


def test_data_tokenizer_and_verifier_flags_take_effect(flagged, demo_prompts):
    trainer = flagged["trainer"]
    assert Path(trainer.dataset.path) == Path(demo_prompts)
    assert trainer.scorer.weights == {"accuracy_reward": 1.0, "hash_format_reward": 0.25}
    metrics = (Path(trainer.config.rl_config.output_dir) / "metrics.jsonl").read_text(encoding="utf-8")
    assert "hash_format_reward" in metrics
    # the checkpoint exports the run's tokenizer: the one --tokenizer_dir named
    saved = json.loads((flagged["saved"] / "model" / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert saved["model_max_length"] == 4321


def test_checkpoint_flags_take_effect(flagged):
    """--save_checkpoint_dir holds the checkpoints (none under output_dir); --resume_training continues from it."""
    tmp, trainer, resumed = flagged["tmp"], flagged["trainer"], flagged["resumed"]
    assert flagged["saved"].parent == tmp / "ckpts"
    assert not (Path(trainer.config.rl_config.output_dir) / "checkpoints").exists()
    assert (trainer.step, resumed.step) == (1, 1)
    after, loaded = _weights(trainer.worker.actor), _weights(resumed.worker.actor)
    for name, value in after.items():
        np.testing.assert_allclose(loaded[name], value, rtol=0, atol=1e-6, err_msg=name)
