"""User tools for tests/test_tools.py: top-level functions, as worker processes import tools by name."""
import os
import time

from mindgrpo.tools import tool_signature


def lookup_price(item: str, quantity: int = 1) -> float:
    """Price of some items.

    Args:
        item: the item's name
        quantity: how many
    """
    return {"apple": 0.5, "pear": 0.75}[item] * quantity


@tool_signature("Greets someone.", {"type": "object", "properties": {"who": {"type": "string"}}, "required": ["who"]})
def greet(who):
    return f"hello {who}"


def no_docstring(x: int) -> int:
    return x


def hang(seconds: float) -> str:
    """Sleeps.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "woke up"


class Unprintable:
    def __str__(self):
        raise RuntimeError("cannot print me")


def unprintable() -> str:
    """Returns something that cannot be printed."""
    return Unprintable()


def die() -> str:
    """Ends its own process."""
    os._exit(3)


def whoami() -> str:
    """The process id of the worker that runs the call (each rank has workers of its own)."""
    return str(os.getpid())
