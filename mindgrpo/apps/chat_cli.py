"""Chat with a model: a Hugging Face folder, a mindgrpo run folder (its newest checkpoint), a checkpoint, or a LoRA
adapter on its base. Answers stream as they are sampled, through the model's chat template and mindgrpo's KV-cache
engine; the conversation is remembered until /reset.

    mindgrpo chat output/demo                                      # the demo run's newest checkpoint
    mindgrpo chat Qwen2.5-0.5B-Instruct --system "You are terse." --temperature 0
    mindgrpo chat output/demo --prompt "What is 3 + 4?"            # one answer, no terminal needed
    mindgrpo chat output/demo_vl --image squares.png --prompt "How many squares are in the picture?"

In the terminal: type a message and Enter; /image PATH attaches a picture to your next message (Qwen2.5-VL);
/reset forgets the conversation; /exit (or Ctrl-D) leaves.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

import mindgrpo  # noqa: F401  (configures MindSpore/MindFormers logging before they load)
from mindgrpo.apps.chat import ChatSession, ChatSettings
from mindgrpo.apps.model_source import add_model_arguments


def parse_args(argv: Optional[Sequence[str]] = None, prog: Optional[str] = "mindgrpo chat") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--prompt", help="answer this one message and exit (no terminal needed)")
    parser.add_argument("--image", help="a picture for the first message (Qwen2.5-VL models)")
    parser.add_argument("--system", help="the system prompt (default: the chat template's own)")
    parser.add_argument("--temperature", type=float, default=0.7, help="0 answers greedily (default 0.7)")
    parser.add_argument("--top-p", type=float, default=0.8, help="nucleus sampling (default 0.8)")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--max-context", type=int, default=4096,
                        help="tokens of conversation and answer the engine holds (default 4096)")
    parser.add_argument("--seed", type=int, help="sampling seed (default: a fresh one)")
    return parser.parse_args(argv)


def _answer(session: ChatSession, text: str, image: Optional[str]) -> None:
    for piece in session.reply(text, image):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = "mindgrpo chat") -> int:
    args = parse_args(argv, prog)
    settings = ChatSettings(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                            seed=args.seed)
    try:
        session = ChatSession(args.model, base=args.base, tokenizer=args.tokenizer, system=args.system,
                              settings=settings, max_context=args.max_context, compute_dtype=args.dtype)
        if args.prompt is not None:
            _answer(session, args.prompt, args.image)
            return 0
        interactive = sys.stdin.isatty()
        if interactive:
            step = f", checkpoint step {session.resolved.step}" if session.resolved.step is not None else ""
            print(f"[chat] {session.resolved.weights_dir}{step}. /image PATH, /reset, /exit", file=sys.stderr)
        image = args.image
        while True:
            if interactive:
                sys.stderr.write("> ")
                sys.stderr.flush()
            line = sys.stdin.readline()
            if not line or line.strip() == "/exit":
                return 0
            text = line.rstrip("\n")
            if text.strip() == "/reset":
                session.reset()
                print("[chat] the conversation is forgotten", file=sys.stderr)
            elif text.startswith("/image "):
                image = text[len("/image "):].strip()
            elif text.strip():
                try:
                    _answer(session, text, image)
                except ValueError as err:  # a message too long, a picture that cannot be read: say so, go on
                    print(f"error: {err}", file=sys.stderr)
                image = None
    except ValueError as err:  # ModelSourceError, ChatError, TokenizerError: all name the fix
        print(f"error: {err}", file=sys.stderr)
        return 2
