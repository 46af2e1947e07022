"""LoRA adapters (mindgrpo.models.lora) against PEFT on transformers' Qwen2: log-probs and the adapters' gradients,
the backbone as the reference policy, PEFT's initialisation, and the PEFT folder both ways."""
import json

import numpy as np
import pytest

import mindgrpo  # noqa: F401  (before mindspore)
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindgrpo.models import build_model
from mindgrpo.models.lora import LoraSpec, adapter_parameters, read_peft_spec, save_peft
from mindgrpo.models.weights import host_array

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

RANK, ALPHA = 4, 8.0
ATTENTION_ONLY = ("q_proj", "v_proj", "o_proj")


class TokenLogProbs(nn.Cell):
    """log p(token t+1 | tokens <= t) of the model's full-sequence pass."""

    def __init__(self, model, adapters=True):
        super().__init__(auto_prefix=False)
        self.forward = model.full_sequence(64, adapters=adapters)

    def construct(self, input_ids, attention_mask):
        logp = ops.log_softmax(self.forward(input_ids, attention_mask)[:, :-1], -1)
        return ops.gather_elements(logp, 2, ops.expand_dims(input_ids[:, 1:], -1)).squeeze(-1)


class WeightedLogProbs(nn.Cell):
    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.scorer = TokenLogProbs(model)

    def construct(self, input_ids, attention_mask, weights):
        return (self.scorer(input_ids, attention_mask) * weights).sum()


def _batch(vocab, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, (2, 12)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, :3] = 0  # a left-padded row
    weights = rng.normal(size=(2, 11)).astype(np.float32) * _scored(mask)
    return ids, mask, weights


def _scored(mask):
    """The predictions that mean something: a real token predicted from a real one."""
    return (mask[:, :-1] * mask[:, 1:]).astype(bool)


def _random_adapters(model, seed=1):
    """Nonzero A and B (a trained adapter), so every product of the LoRA path is exercised."""
    rng = np.random.default_rng(seed)
    values = {}
    for name, param in adapter_parameters(model).items():
        values[name] = rng.normal(0.0, 0.2, param.shape).astype(np.float32)
        param.set_data(Tensor(values[name]))
    return values


def _peft_model(model_dir, spec, values):
    base = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
    config = peft.LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=list(spec.target_modules),
                             lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    wrapped = peft.get_peft_model(base, config)
    state = {f"base_model.model.{name.replace('.weight', '.default.weight')}": torch.from_numpy(value)
             for name, value in values.items()}
    missing = set(state) - set(wrapped.state_dict())
    assert not missing, sorted(missing)[:3]
    wrapped.load_state_dict(state, strict=False)
    return wrapped.eval()


def _torch_logprobs(wrapped, ids, mask):
    input_ids, attention = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    logits = wrapped(input_ids=input_ids, attention_mask=attention, position_ids=positions).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    return logp.gather(2, input_ids[:, 1:, None]).squeeze(-1)


@pytest.mark.parametrize("targets", [None, ATTENTION_ONLY], ids=["all_linear", "attention"])
def test_logprobs_and_adapter_gradients_equal_peft(ms_mode, tiny_model_dir, targets):
    """Our LoRA forward and the adapters' gradients against PEFT's LoraModel on transformers' Qwen2, with the same
    (nonzero) adapters: log-probs within 1e-5, gradients within 1e-5 of their scale; the backbone gets none."""
    spec = LoraSpec(RANK, ALPHA, targets or LoraSpec(RANK, ALPHA).target_modules)
    model = build_model(tiny_model_dir, lora=spec)
    values = _random_adapters(model)
    ids, mask, weights = _batch(model.spec.vocab_size)
    assert [p.name for p in model.trainable_params()] == [p.name for p in adapter_parameters(model).values()]

    grad_fn = ms.value_and_grad(WeightedLogProbs(model), None, model.trainable_params())
    if ms_mode == "graph":
        grad_fn = ms.jit(grad_fn)
    _, grads = grad_fn(Tensor(ids), Tensor(mask), Tensor(weights))
    logp = TokenLogProbs(model)(Tensor(ids), Tensor(mask)).asnumpy()

    wrapped = _peft_model(tiny_model_dir, spec, values)
    expected = _torch_logprobs(wrapped, ids, mask)
    (expected * torch.from_numpy(weights)).sum().backward()
    real = _scored(mask)
    assert np.abs(logp - expected.detach().numpy())[real].max() < 1e-5
    torch_grads = {name.replace("base_model.model.", "").replace(".default", ""): p.grad.numpy()
                   for name, p in wrapped.named_parameters() if p.requires_grad}
    assert set(torch_grads) == set(values)
    for (name, _), grad in zip(adapter_parameters(model).items(), grads):
        want = torch_grads[name]
        assert np.abs(grad.asnumpy() - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), name


def test_backbone_is_the_reference_and_fresh_adapters_change_nothing(tiny_model_dir):
    """adapters=False is the model without LoRA exactly; PEFT's init (B = 0) leaves the policy equal to the backbone
    bit for bit (step 1's KL is 0), and a trained adapter moves it."""
    spec = LoraSpec(RANK, ALPHA)
    plain = build_model(tiny_model_dir)
    model = build_model(tiny_model_dir, lora=spec)
    ids, mask, _ = _batch(model.spec.vocab_size)
    args = (Tensor(ids), Tensor(mask))
    base = TokenLogProbs(plain)(*args).asnumpy()
    np.testing.assert_array_equal(TokenLogProbs(model, adapters=False)(*args).asnumpy(), base)
    np.testing.assert_array_equal(TokenLogProbs(model)(*args).asnumpy(), base)  # B = 0
    adapters = {name: host_array(p) for name, p in adapter_parameters(model).items()}
    for name, value in adapters.items():
        if ".lora_B." in name:
            assert not value.any()
        else:  # PEFT's kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in))
            bound = 1 / np.sqrt(value.shape[1])
            assert np.abs(value).max() <= bound and np.abs(value).max() > 0.8 * bound and value.std() > 0.4 * bound
    _random_adapters(model)
    assert np.abs(TokenLogProbs(model)(*args).asnumpy() - base).max() > 1e-2
    np.testing.assert_array_equal(TokenLogProbs(model, adapters=False)(*args).asnumpy(), base)


def test_peft_folder_loads_in_peft_and_back(tmp_path, tiny_model_dir):
    """save_peft writes what peft.PeftModel.from_pretrained loads onto the transformers base with our logits
    (1e-4); load_peft reads it back exactly and refuses an adapter of another rank."""
    spec = LoraSpec(RANK, ALPHA, ATTENTION_ONLY)
    model = build_model(tiny_model_dir, lora=spec)
    values = _random_adapters(model)
    folder = save_peft(values, spec, tmp_path / "adapter", base_model=str(tiny_model_dir))
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert read_peft_spec(folder) == spec

    base = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), torch_dtype=torch.float32)
    loaded = peft.PeftModel.from_pretrained(base, str(folder)).eval()
    ids, mask, _ = _batch(model.spec.vocab_size)
    with torch.no_grad():
        expected = _torch_logprobs(loaded, ids, mask).numpy()
    got = TokenLogProbs(model)(Tensor(ids), Tensor(mask)).asnumpy()
    assert np.abs(got - expected)[_scored(mask)].max() < 1e-4

    again = build_model(tiny_model_dir, lora=spec, adapter_dir=folder)
    for name, param in adapter_parameters(again).items():
        np.testing.assert_array_equal(host_array(param), values[name])
    with pytest.raises(ValueError, match="rank 4.*actor_config asks for rank 8"):
        build_model(tiny_model_dir, lora=LoraSpec(8, ALPHA, ATTENTION_ONLY), adapter_dir=folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(ValueError, match="use_dora"):
        read_peft_spec(folder)


def test_merged_folder_loads_in_transformers_with_peft_merged_logits(tmp_path, tiny_model_dir):
    """`mindgrpo merge`: the base with W + s B A, a plain HF folder that transformers loads, whose logits equal
    PEFT's own merge_and_unload() of the same adapter (1e-5); an adapter for another base is refused."""
    from mindgrpo.cli import main as cli

    spec = LoraSpec(RANK, ALPHA)
    model = build_model(tiny_model_dir, lora=spec)
    values = _random_adapters(model)
    folder = save_peft(values, spec, tmp_path / "adapter", base_model=str(tiny_model_dir))
    assert cli(["merge", str(folder), str(tmp_path / "merged")]) == 0
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32)
    base = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    reference = peft.PeftModel.from_pretrained(base, str(folder)).merge_and_unload()
    ids, mask, _ = _batch(model.spec.vocab_size)
    with torch.no_grad():
        np.testing.assert_allclose(_torch_logprobs(merged, ids, mask).numpy(),
                                   _torch_logprobs(reference, ids, mask).numpy(), atol=1e-5)
    (tmp_path / "other").mkdir()
    other = save_peft({name.replace("layers.0.", "layers.9."): v for name, v in values.items()}, spec,
                      tmp_path / "other" / "adapter", base_model=str(tiny_model_dir))
    assert cli(["merge", str(other), str(tmp_path / "merged2")]) == 2
    assert not (tmp_path / "merged2").exists()


def test_tensor_parallel_ranks_hold_slices_of_the_same_adapters(tmp_path, tiny_model_dir):
    """At model_parallel 2 each rank's fresh adapters are its slices of the one-rank adapters (drawn whole, then
    sliced: B beside q/k/v/gate/up by rows, A beside o/down by columns, the other halves whole), and a PEFT folder
    loads onto the ranks as slices that assemble back to it. (Building a rank runs no collective; training at 2 x 2:
    tests/test_data_tensor_parallel.py.)"""
    spec = LoraSpec(4, 8.0)
    one = build_model(tiny_model_dir, lora=spec)
    ranks = [build_model(tiny_model_dir, lora=spec, tp_rank=r, tp_size=2) for r in range(2)]
    layout = ranks[0].layout

    def assembled(models):
        return {name: layout.assemble(name, [host_array(adapter_parameters(m)[name]) for m in models],
                                      one.adapter_shapes[name]) for name in one.adapter_shapes}

    fresh = {name: host_array(p) for name, p in adapter_parameters(one).items()}
    for name, value in assembled(ranks).items():
        np.testing.assert_array_equal(value, fresh[name], err_msg=name)
    halves = {name: host_array(p).shape for name, p in adapter_parameters(ranks[1]).items()}
    q, o = "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj"
    assert halves[f"{q}.lora_B.weight"][0] * 2 == fresh[f"{q}.lora_B.weight"].shape[0]
    assert halves[f"{q}.lora_A.weight"] == fresh[f"{q}.lora_A.weight"].shape
    assert halves[f"{o}.lora_A.weight"][1] * 2 == fresh[f"{o}.lora_A.weight"].shape[1]
    assert halves[f"{o}.lora_B.weight"] == fresh[f"{o}.lora_B.weight"].shape
    rng = np.random.default_rng(3)
    values = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in one.adapter_shapes.items()}
    save_peft(values, spec, tmp_path / "adapter", base_model=str(tiny_model_dir))
    loaded = [build_model(tiny_model_dir, tp_rank=r, tp_size=2, adapter_dir=tmp_path / "adapter") for r in range(2)]
    for name, value in assembled(loaded).items():
        np.testing.assert_array_equal(value, values[name], err_msg=name)
