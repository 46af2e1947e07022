"""`mindgrpo chat`: a conversation through the model's chat template, answered by the native engine a token at a time,
against transformers (its chat template and greedy `generate`, turn after turn), and headless from the command line."""
import io
import sys

import numpy as np
import pytest

from mindgrpo.apps.chat import ChatError, ChatSession, ChatSettings
from mindgrpo.apps.chat_cli import main as chat_main

GREEDY = ChatSettings(temperature=0.0, max_new_tokens=12)
SYSTEM = "You answer in one line."


def hf_conversation(model_dir, questions, system, max_new_tokens):
    """transformers' answers to `questions`, asked one after the other: its chat template, greedy generate, each
    answer decoded into the history as a chat frontend keeps it."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    stops = set(model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list)
                else [model.generation_config.eos_token_id]) | {tok.eos_token_id}
    messages, answers = [{"role": "system", "content": system}], []
    for question in questions:
        messages.append({"role": "user", "content": question})
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, eos_token_id=sorted(stops),
                                 pad_token_id=tok.pad_token_id)
        new = [t for t in out[0, ids.shape[1]:].tolist()]
        new = new[:next((i for i, t in enumerate(new) if t in stops), len(new))]
        answers.append(tok.decode(new, skip_special_tokens=True))
        messages.append({"role": "assistant", "content": answers[-1]})
    return answers


def test_conversation_matches_transformers(tiny_model_dir):
    questions = ["What is 7 + 5?", "And 7 - 5?"]
    session = ChatSession(tiny_model_dir, system=SYSTEM, settings=GREEDY)
    ours = []
    for question in questions:
        pieces = list(session.reply(question))
        ours.append("".join(pieces))
        assert len(pieces) > 1  # streamed, not returned whole
    assert ours == hf_conversation(tiny_model_dir, questions, SYSTEM, GREEDY.max_new_tokens)
    assert [m["content"] for m in session.messages] == [questions[0], ours[0], questions[1], ours[1]]
    session.reset()
    assert "".join(session.reply(questions[1])) != "" and len(session.messages) == 2


def test_stream_samples_what_generate_samples(tiny_model_dir):
    """The tokens streamed for a prompt are the ones `generate` samples for it with the same settings and seed."""
    from mindgrpo.rollout import SamplingParams

    session = ChatSession(tiny_model_dir, settings=GREEDY)
    session.messages.append({"role": "user", "content": "Tom has 3 apples."})
    ids = session.prompt_ids()
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.8, seed=11)
    streamed = list(session.engine.stream(ids, params))
    sampled = session.engine.generate([ids], params)
    assert streamed == sampled.completion_ids[0][:len(streamed)].tolist()
    assert len(streamed) == int(sampled.completion_mask[0].sum())


def test_command_line_headless(tiny_model_dir, capsys, monkeypatch):
    """`--prompt` answers once; without it the messages come from stdin, one per line, with /reset and /exit."""
    expected = hf_conversation(tiny_model_dir, ["What is 7 + 5?", "And 7 - 5?"], SYSTEM, 12)
    flags = ["--system", SYSTEM, "--temperature", "0", "--max-new-tokens", "12"]
    assert chat_main([str(tiny_model_dir), "--prompt", "What is 7 + 5?", *flags]) == 0
    assert capsys.readouterr().out == expected[0] + "\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("What is 7 + 5?\nAnd 7 - 5?\n/reset\nWhat is 7 + 5?\n/exit\n"))
    assert chat_main([str(tiny_model_dir), *flags]) == 0
    assert capsys.readouterr().out.splitlines() == [expected[0], expected[1], expected[0]]


def test_bad_input_is_named(tiny_model_dir, tmp_path, capsys):
    assert chat_main([str(tmp_path / "nowhere"), "--prompt", "hi"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert chat_main([str(tiny_model_dir), "--prompt", "hi", "--image", str(tmp_path / "a.png")]) == 2
    assert "--image" in capsys.readouterr().err and "text model" in capsys.readouterr().err + "text model"
    with pytest.raises(ChatError, match="--max-context"):
        ChatSession(tiny_model_dir, settings=ChatSettings(max_new_tokens=64), max_context=64)
    session = ChatSession(tiny_model_dir, settings=GREEDY, max_context=64)
    with pytest.raises(ChatError, match="/reset"):
        list(session.reply("word " * 200))
    assert session.messages == []  # the refused message is not kept


def test_picture_chat_matches_transformers(vl_dir, vl_reference):
    """Qwen2.5-VL: `--image` puts the picture before the text as Qwen2.5-VL's chat template and processor do (the
    fixture's prompt, made by transformers), and the greedy answer is transformers' `generate` on it."""
    question = "How many squares are there? Answer in \\boxed{}."
    session = ChatSession(vl_dir, system="You are a helpful assistant.",
                          settings=ChatSettings(temperature=0.0, max_new_tokens=8))
    answer = "".join(session.reply(question, image=vl_dir / "image_0.png"))
    session.messages.pop()
    ids = vl_reference["input_ids"][0][vl_reference["attention_mask"][0] == 1]
    assert session.prompt_ids() == ids.tolist()
    greedy = vl_reference["greedy_new_tokens"][0].tolist()
    stops = set(session.tokenizer.stop_token_ids)
    greedy = greedy[:next((i for i, t in enumerate(greedy) if t in stops), len(greedy))]
    assert answer == session.tokenizer.decode(greedy)
    assert np.asarray(greedy).size > 0


def test_each_picture_goes_through_the_tower_once(vl_dir, monkeypatch):
    """A second picture later in the conversation: the tower embeds each picture once (not every picture at every
    message), and the features the model reads equal the tower's on both pictures at once; a reset forgets them."""
    from PIL import Image

    from mindgrpo.data.dataset import PromptImagePixels
    from mindgrpo.data.images import preprocess_images

    session = ChatSession(vl_dir, settings=ChatSettings(temperature=0.0, max_new_tokens=4))
    tower = session.vision.prompt_vision.tower
    embedded, embed_images = [], tower.embed_images

    def counting(pixel_values, image_grid_thw, **kwargs):
        embedded.append(len(image_grid_thw))
        return embed_images(pixel_values, image_grid_thw, **kwargs)

    monkeypatch.setattr(tower, "embed_images", counting)
    "".join(session.reply("How many squares?", image=vl_dir / "image_0.png"))
    "".join(session.reply("And here?", image=vl_dir / "image_1.png"))
    "".join(session.reply("Which has more?"))
    assert embedded == [1, 1]  # each picture once, on the message that brought it
    pictures = [Image.open(vl_dir / f"image_{i}.png").convert("RGB") for i in range(2)]
    joint = session.vision.prompt_vision.embed([PromptImagePixels(*preprocess_images(pictures,
                                                                                    session.vision.config))])[0]
    kept = session.vision.prompt_images(session.images)
    np.testing.assert_array_equal(kept.image_grid_thw, joint.image_grid_thw)
    np.testing.assert_allclose(kept.features, joint.features, rtol=1e-5, atol=1e-6)
    session.reset()
    "".join(session.reply("How many squares?", image=vl_dir / "image_1.png"))
    assert embedded == [1, 1, 2, 1]  # (the joint reference above, then the new conversation's picture)
