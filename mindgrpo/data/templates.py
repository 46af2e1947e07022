"""Prompt templates: how a dataset question becomes the text the policy is prompted with.

A template is chosen by name (`--prompt_template`, the config's `prompt_template`) at conversion time and again by
evaluation, so both render a question the same way. A question with images (`<image>` tags) is rendered by
`render_vl_prompt`: the template's user turn goes through Qwen2.5-VL's chat template, each tag becoming the image's
`<|vision_start|><|image_pad|>...<|vision_end|>` block.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from mindgrpo.data.tool_format import system_turn


@dataclass(frozen=True)
class PromptTemplate:
    """A prompt format: `text` with one `{question}` placeholder."""
    name: str
    text: str
    description: str

    def render(self, question: str) -> str:
        return self.text.replace("{question}", question)  # not str.format: templates may hold literal braces


PROMPT_TEMPLATES: dict[str, PromptTemplate] = {t.name: t for t in (
    PromptTemplate(
        "r1_zero",
        "<|im_start|>user\n{question}\nThink through the problem step by step inside <think> </think> tags, then "
        "give only the final answer inside <answer> </answer> tags, i.e. <think> reasoning here </think> "
        "<answer> answer here </answer>.<|im_end|>\n<|im_start|>assistant\n",
        "DeepSeek-R1-Zero style: a ChatML user turn (no system turn) asking for the reasoning inside "
        "<think> </think> and the final answer inside <answer> </answer>; pairs with tag-based format rewards."),
    PromptTemplate(
        "gsm8k_hash",
        "<|im_start|>user\n{question}\nLet's think step by step and output the final answer after \"####\"."
        "<|im_end|>\n<|im_start|>assistant\n",
        "A ChatML user turn without a system turn asking for the answer after '####', as GSM8K's own solutions "
        "write it: byte for byte the prompt of the TRL benchmark mindgrpo is measured against (tools/trl_peer.py)."),
    PromptTemplate(
        "chatml",
        "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n",
        "The question as a ChatML user turn with no added instructions, for sources whose questions already say "
        "how to answer (DAPO-Math-17k asks for 'Answer: $Answer')."),
    PromptTemplate(
        "raw",
        "{question}",
        "The question as is: for base models without a chat format, or questions that are already full prompts."),
    PromptTemplate(
        "geo3k",
        "<|im_start|>user\n{question} You FIRST think about the reasoning process as an internal monologue and then "
        "provide the final answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final "
        "answer MUST BE put in \\boxed{}.<|im_end|>\n<|im_start|>assistant\n",
        "verl's geo3k prompt (as its geo3k preprocessing example writes it): the problem, a space, then the instruction to "
        "think inside <think> </think> and put the final answer in \\boxed{}; pairs with geo3k_reward."),
)}


def render_prompt(template: str, question: str) -> str:
    """The prompt text for `question` under the template named `template` (a key of PROMPT_TEMPLATES)."""
    try:
        return PROMPT_TEMPLATES[template].render(question)
    except KeyError:
        raise ValueError(f"unknown prompt template {template!r}; choose one of "
                         f"{', '.join(PROMPT_TEMPLATES)}") from None


# Qwen2.5-VL-Instruct's chat template (its chat_template.json), verbatim: the default system turn, then each image
# of a user turn as one `<|vision_start|><|image_pad|><|vision_end|>` block, expanded afterwards to one pad per merged
# patch as Qwen2_5_VLProcessor does.
QWEN25_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}")
IMAGE_PAD = "<|image_pad|>"
_USER_TURN = re.compile(r"<\|im_start\|>user\n(?P<content>.*)<\|im_end\|>\n<\|im_start\|>assistant\n", re.DOTALL)


def render_tool_prompt(template: str, question: str, signatures: Sequence[dict]) -> str:
    """The prompt text for `question` offering tools: Qwen2.5's system turn listing their `signatures`
    (:func:`~mindgrpo.data.tool_format.system_turn`) before the template's user turn, as Qwen2.5's chat template
    renders a user message with ``tools=``."""
    text = render_prompt(template, question)
    if _USER_TURN.fullmatch(text) is None:
        raise ValueError(f"prompt template {template!r} is not one ChatML user turn, so it cannot offer tools; use "
                         "chatml, gsm8k_hash or r1_zero")
    return system_turn(signatures) + text


def render_vl_prompt(template: str, question: str, image_tokens: Sequence[int], image_tag: str = "<image>") -> str:
    """The prompt text for a question with images: the user turn of the template named `template` rendered through
    Qwen2.5-VL's chat template, its i-th `image_tag` replaced by the i-th image's block of `image_tokens[i]`
    `<|image_pad|>` tokens (one per merged patch, `images.image_token_count`), exactly as verl builds geo3k prompts
    (the question split at the tags into image and text parts) and Qwen2_5_VLProcessor expands them."""
    from mindgrpo.data.tokenizer import compile_chat_template  # the jinja sandbox transformers renders with

    text = render_prompt(template, question)
    turn = _USER_TURN.fullmatch(text)
    if turn is None:
        raise ValueError(f"prompt template {template!r} is not one ChatML user turn, so it cannot be rendered with "
                         "images; use geo3k, chatml, r1_zero or gsm8k_hash")
    parts = turn["content"].split(image_tag)
    if len(parts) - 1 != len(image_tokens):
        raise ValueError(f"the question has {len(parts) - 1} {image_tag} tag(s) for {len(image_tokens)} image(s)")
    content = [{"type": "text", "text": parts[0]}]
    for part in parts[1:]:
        content += [{"type": "image"}, {"type": "text", "text": part}]
    rendered = compile_chat_template(QWEN25_VL_CHAT_TEMPLATE).render(
        messages=[{"role": "user", "content": content}], add_generation_prompt=True)
    pieces = rendered.split(IMAGE_PAD)
    if len(pieces) - 1 != len(image_tokens):  # the question itself spelled the special token
        raise ValueError(f"the question contains {IMAGE_PAD!r}, which only an image may produce")
    return pieces[0] + "".join(IMAGE_PAD * n + rest for n, rest in zip(image_tokens, pieces[1:]))
