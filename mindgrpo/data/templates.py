"""Prompt templates: how a dataset question becomes the text the policy is prompted with.

A template is chosen by name (`--prompt_template`, the config's `prompt_template`) at conversion time and again by
evaluation, so both render a question the same way.
"""
from __future__ import annotations

from dataclasses import dataclass


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
        "The peer TRL benchmark's prompt (../shared/peer/trl_grpo_bench.py), byte for byte: a ChatML user turn "
        "without a system turn asking for the answer after '####', as GSM8K's own solutions write it."),
    PromptTemplate(
        "chatml",
        "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n",
        "The question as a ChatML user turn with no added instructions, for sources whose questions already say "
        "how to answer (DAPO-Math-17k asks for 'Answer: $Answer')."),
    PromptTemplate(
        "raw",
        "{question}",
        "The question as is: for base models without a chat format, or questions that are already full prompts."),
)}


def render_prompt(template: str, question: str) -> str:
    """The prompt text for `question` under the template named `template` (a key of PROMPT_TEMPLATES)."""
    try:
        return PROMPT_TEMPLATES[template].render(question)
    except KeyError:
        raise ValueError(f"unknown prompt template {template!r}; choose one of "
                         f"{', '.join(PROMPT_TEMPLATES)}") from None
