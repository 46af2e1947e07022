"""The ``calculator`` tool: arithmetic on numbers, parsed (never evaluated as code).

An expression is parsed with :mod:`ast` and only numbers, parentheses, ``+ - * / // % **`` and unary signs are
evaluated; anything else (names, calls, attributes) is refused with a message the model can read. Powers and results
are bounded, so ``9 ** 9 ** 9`` is an error rather than a minute of CPU.
"""
from __future__ import annotations

import ast
import math
import operator

MAX_EXPONENT = 1000
MAX_RESULT_DIGITS = 1000

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(127 * 46) - 3 ** 2"
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    return _format(_evaluate(tree.body))


def _evaluate(node: ast.AST):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > MAX_EXPONENT or (
                abs(left) > 1 and right * math.log10(abs(left)) > MAX_RESULT_DIGITS)):
            raise ValueError(f"{ast.unparse(node)} is too large (exponents up to {MAX_EXPONENT}, results up to "
                             f"{MAX_RESULT_DIGITS} digits)")
        result = _BINARY[type(node.op)](left, right)  # ZeroDivisionError speaks for itself
        if isinstance(result, int) and result.bit_length() > MAX_RESULT_DIGITS * 3.33:
            raise ValueError(f"the result has more than {MAX_RESULT_DIGITS} digits")
        if isinstance(result, complex):
            raise ValueError("the result is not a real number")
        return result
    raise ValueError(f"only numbers and + - * / // % ** are allowed, not {ast.unparse(node)!r}")


def _format(value) -> str:
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) < 1e16:
            return str(int(value))
        return repr(value)
    return str(value)
