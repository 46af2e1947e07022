"""Talk to a model: a conversation held as chat messages, rendered by the model's chat template, answered a token at
a time by the native KV-cache engine (``mindgrpo chat``).

The model is what ``mindgrpo eval`` takes (:func:`~mindgrpo.apps.model_source.resolve_model`): a Hugging Face folder,
a run folder (its newest checkpoint), a checkpoint, or a LoRA adapter on its base. Each answer re-renders the whole
conversation with the chat template, as transformers' ``apply_chat_template`` does, and the engine prefills it and
samples (:meth:`~mindgrpo.rollout.backends.native.NativeRolloutEngine.stream`): the tokens are those ``generate``
samples for that prompt and seed. A Qwen2.5-VL model reads pictures: an image given with a message is put in front
of its text, as Qwen2.5-VL's chat template and processor render it; the frozen vision tower sees each picture once.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from mindgrpo.apps.model_source import ModelSourceError, resolve_model
from mindgrpo.config import PROMPT_LENGTH_BUCKET

PathLike = Union[str, os.PathLike]


class ChatError(ValueError):
    """A chat setting or message cannot be used; the message names the flag or the fix."""


@dataclass(frozen=True)
class ChatSettings:
    """How answers are sampled (the flags of ``mindgrpo chat``)."""
    temperature: float = 0.7
    """0 answers greedily (the same answer every time)."""
    top_p: float = 0.8
    """Nucleus sampling (Qwen2.5-Instruct's generation_config uses 0.7 and 0.8)."""
    max_new_tokens: int = 512
    seed: Optional[int] = None
    """Sampling seed of the first answer (each answer after it uses the next one); None draws one."""


class ChatSession:
    """One conversation with one model: :meth:`reply` adds a user message and streams the answer's text."""

    def __init__(self, model: PathLike, *, base: Optional[PathLike] = None, tokenizer: Optional[PathLike] = None,
                 system: Optional[str] = None, settings: ChatSettings = ChatSettings(),
                 max_context: int = 4096, compute_dtype: str = "float32"):
        from mindgrpo.data.tokenizer import load_tokenizer
        from mindgrpo.models import build_model
        from mindgrpo.rollout import build_rollout_engine

        if settings.max_new_tokens < 1 or max_context <= settings.max_new_tokens:
            raise ChatError(f"need --max-new-tokens >= 1 and --max-context > --max-new-tokens, got "
                            f"{settings.max_new_tokens} and {max_context}")
        self.resolved = resolve_model(model, tokenizer, base)
        self.tokenizer = load_tokenizer(self.resolved.tokenizer_dir)
        self.settings = settings
        self.model = build_model(self.resolved.weights_dir, role="inference", compute_dtype=compute_dtype,
                                 adapter_dir=self.resolved.adapter_dir)
        limit = min(max_context, self.model.spec.max_position_embeddings) - settings.max_new_tokens
        self.max_prompt_length = max(PROMPT_LENGTH_BUCKET, limit // PROMPT_LENGTH_BUCKET * PROMPT_LENGTH_BUCKET)
        self.engine = build_rollout_engine("native", self.model, eos_token_id=self.tokenizer.stop_token_ids,
                                           pad_token_id=self.tokenizer.pad_token_id,
                                           max_prompt_length=self.max_prompt_length, max_batch_size=1)
        self.vision = _Vision(self.resolved.weights_dir, self.model.vision) if self.model.is_vl else None
        self.system = system
        self.messages: List[Dict[str, Any]] = []
        self.images: List[Any] = []  # the conversation's pictures, in order (PIL images)
        self.answers = 0

    def reset(self) -> None:
        """Forget the conversation (the system prompt stays)."""
        self.messages, self.images = [], []

    def prompt_ids(self) -> List[int]:
        """The conversation so far, rendered for the model's next answer, as token ids."""
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + self.messages
        if self.vision is not None:
            return self.vision.prompt_ids(self.tokenizer, messages, self.images)
        return self.tokenizer.encode(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    def reply(self, text: str, image: Optional[PathLike] = None) -> Iterator[str]:
        """Add the user message `text` (with the picture `image`, for Qwen2.5-VL) and yield the answer's text as it
        is sampled; the answer joins the conversation when it is complete."""
        from mindgrpo.rollout import SamplingParams

        message: Dict[str, Any] = {"role": "user", "content": text}
        if image is not None:
            if self.vision is None:
                raise ChatError(f"--image {image}: {self.resolved.weights_dir} is a text model; images need a "
                                "Qwen2.5-VL model")
            self.images.append(_open_image(Path(image)))
            message["content"] = [{"type": "image"}, {"type": "text", "text": text}]
        self.messages.append(message)
        ids = self.prompt_ids()
        if len(ids) > self.max_prompt_length:
            self.messages.pop()
            if image is not None:
                self.images.pop()
            raise ChatError(f"the conversation is {len(ids)} tokens, more than the {self.max_prompt_length} "
                            "--max-context leaves for the answer: /reset it, or raise --max-context")
        s = self.settings
        params = SamplingParams(max_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                                seed=None if s.seed is None else s.seed + self.answers)
        images = None if self.vision is None else self.vision.prompt_images(self.images)
        stops = set(self.tokenizer.stop_token_ids)
        tokens: List[int] = []
        shown = ""
        for token in self.engine.stream(ids, params, images):
            if token in stops:
                break
            tokens.append(token)
            text_so_far = self.tokenizer.decode(tokens)
            if not text_so_far.endswith("\ufffd"):  # a character split over tokens waits for its last byte
                yield text_so_far[len(shown):]
                shown = text_so_far
        answer = self.tokenizer.decode(tokens)
        if answer != shown:
            yield answer[len(shown):]
        self.messages.append({"role": "assistant", "content": answer})
        self.answers += 1


def _open_image(path: Path):
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()
            return image.copy()
    except (OSError, ValueError) as err:
        raise ChatError(f"--image {path}: cannot read it as a picture ({err})") from None


class _Vision:
    """A Qwen2.5-VL model's pictures in a chat: its processor settings and frozen tower, and the VL chat template
    with each picture's `<|image_pad|>` expanded to one token per merged patch (what Qwen2_5_VLProcessor does)."""

    def __init__(self, model_dir: Path, prompt_vision: Any):
        from mindgrpo.data.images import ImageProcessorConfig

        self.config = ImageProcessorConfig.from_pretrained(model_dir)
        self.prompt_vision = prompt_vision  # the model's own frozen tower (Qwen2Model.vision)
        self.embedded: List[Tuple[Any, Any]] = []  # (picture, its PromptImages) of the conversation so far, in order

    def prompt_ids(self, tokenizer: Any, messages: List[Dict[str, Any]], images: List[Any]) -> List[int]:
        from mindgrpo.data.images import image_grid_thw, image_token_count
        from mindgrpo.data.templates import IMAGE_PAD, QWEN25_VL_CHAT_TEMPLATE
        from mindgrpo.data.tokenizer import compile_chat_template

        text = compile_chat_template(QWEN25_VL_CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=True)
        pieces = text.split(IMAGE_PAD)
        if len(pieces) - 1 != len(images):
            raise ChatError(f"a message spells {IMAGE_PAD!r}, which only an --image may produce")
        # a picture's token count follows from its size alone: its pixels are processed once, by prompt_images
        counts = [image_token_count(image_grid_thw(image.height, image.width, self.config), self.config.merge_size)
                  for image in images]
        return tokenizer.encode(pieces[0] + "".join(IMAGE_PAD * n + rest for n, rest in zip(counts, pieces[1:])))

    def prompt_images(self, images: List[Any]):
        """The conversation's pictures as the language model reads them: each picture through the tower once, when
        it first appears, then kept (the tower's attention never crosses pictures, so a prompt's features are its
        pictures' features in order). A picture is recognised by identity, so a reset or a withdrawn message
        drops its features."""
        import numpy as np

        from mindgrpo.models.prompt_images import PromptImages

        same = 0
        while same < min(len(self.embedded), len(images)) and self.embedded[same][0] is images[same]:
            same += 1
        self.embedded = self.embedded[:same] + [(image, self._embed(image)) for image in images[same:]]
        if not images:
            return None
        features = [entry[1] for entry in self.embedded]
        return PromptImages(np.concatenate([f.features for f in features]),
                            np.concatenate([f.image_grid_thw for f in features]))

    def _embed(self, image: Any):
        """One picture's merged features and grid (:class:`~mindgrpo.models.prompt_images.PromptImages` of one
        image)."""
        from mindgrpo.data.dataset import PromptImagePixels
        from mindgrpo.data.images import preprocess_images

        return self.prompt_vision.embed([PromptImagePixels(*preprocess_images([image], self.config))])[0]


__all__ = ["ChatError", "ChatSession", "ChatSettings", "ModelSourceError"]
