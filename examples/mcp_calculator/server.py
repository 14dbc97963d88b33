"""A calculator MCP server, written with the official ``mcp`` SDK: ``add``, ``multiply``, ``calculate``.

It serves the tool-use learning demo: multi-digit arithmetic a tiny model cannot do in its head but
can with a tool. Results are plain numbers in text (``"56088"``, ``"3.5"``).

``calculate`` evaluates an arithmetic expression *safely*: the expression is parsed with ``ast`` and
only numbers, ``+ - * / // % **`` and parentheses are evaluated (nothing is ever passed to
``eval``/``exec``); sizes are bounded so no expression can run for long or exhaust memory.

Run it::

    python examples/mcp_calculator/server.py              # stdio (how Trine starts it by default)
    python examples/mcp_calculator/server.py --http 8765  # streamable HTTP on http://127.0.0.1:8765/mcp
"""

from __future__ import annotations

import argparse
import ast
import math
import operator
import re

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

MAX_EXPRESSION = 200
"""Longest expression ``calculate`` accepts (characters)."""
MAX_DIGITS = 1000
"""Largest result (decimal digits) any step of a calculation may produce."""

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}

server = MCPServer(
    "calculator",
    instructions="Exact arithmetic: add, multiply, or calculate an expression such as (12 + 7) * 3.",
    log_level="WARNING",
)


@server.tool()
def add(a: int | float, b: int | float) -> str:
    """Add two numbers and return the sum."""
    return format_number(a + b)


@server.tool()
def multiply(a: int | float, b: int | float) -> str:
    """Multiply two numbers and return the product."""
    return format_number(_bounded(a * b))


@server.tool()
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression with numbers, + - * / // % ** and parentheses, e.g. (12 + 7) * 3."""
    return format_number(evaluate(expression))


@server.tool()
def check(expression: str, answer: str) -> str:
    """1 if the last number in ``answer`` equals the value of ``expression``, else 0 (a verifier)."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", answer)
    return "1" if numbers and float(numbers[-1]) == float(evaluate(expression)) else "0"


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; :class:`ToolError` with the reason if it is not one."""
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("expression is empty; write e.g. 12 * (3 + 4)")
    if len(expression) > MAX_EXPRESSION:
        raise ToolError(
            f"expression is {len(expression)} characters long; at most {MAX_EXPRESSION} are allowed"
        )
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ToolError(f"{expression!r} is not an arithmetic expression ({err.msg})") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("the result is too large") from None
    raise ToolError(
        f"{ast.unparse(node)!r} is not allowed: use numbers, + - * / // % ** and parentheses only"
    )


def _check_power(base: int | float, exponent: int | float) -> None:
    if abs(exponent) > 10_000 or (abs(base) > 1 and abs(exponent) * math.log10(abs(base)) > MAX_DIGITS):
        raise ToolError(f"{base} ** {exponent} is too large (more than {MAX_DIGITS} digits)")
    if base == 0 and exponent < 0:
        raise ToolError("division by zero (0 to a negative power)")


def _bounded(value: int | float) -> int | float:
    if isinstance(value, int) and value.bit_length() > MAX_DIGITS * 3.33:
        raise ToolError(f"the result has more than {MAX_DIGITS} digits")
    if isinstance(value, complex):
        raise ToolError("the result is not a real number")
    return value


def format_number(value: int | float) -> str:
    """A number as plain text: integers exactly, integral floats without ``.0``, others as Python writes them."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ToolError(f"the result is {value}")
        if value.is_integer() and abs(value) < 2**53:
            return str(int(value))
    return str(value)


def main(argv: list[str] | None = None) -> None:
    """Serve over stdio, or streamable HTTP with ``--http PORT``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on this port")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind with --http (default 127.0.0.1)")
    args = parser.parse_args(argv)
    if args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host=args.host, port=args.http)


if __name__ == "__main__":
    main()
