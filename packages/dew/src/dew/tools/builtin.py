"""Tools that come with Dew, found by name through the `dew.tools` entry-point group.

`calculator` (`--tool calculator`) evaluates arithmetic safely: the expression is parsed with
`ast` and only numbers, `+ - * / // % **` and parentheses are evaluated, never names, calls or
attributes, with powers and integers bounded so that no expression holds a thread for long. A
tool's docstring is its schema (`dew.tools.json_schema`), what the model reads: its examples
follow a `Raises:` section, which the schema leaves out, as transformers' does.

Reference: Toolformer (Schick et al., 2023), whose calculator tool this is; TRL's tool-calling
examples.

Examples:
  >>> calculator("(3 + 4) * 2"), calculator("7 / 2"), calculator("1 / 0")
  ('14', '3.5', 'Error: division by zero')
  >>> calculator("exit()")
  "Error: not arithmetic: 'exit()'"
"""

import ast
import math
import operator

__all__ = ["calculator"]

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
_MAX_EXPONENT = 100
"""The largest power `calculator` raises to: `9 ** 9 ** 9` would hold the thread for minutes."""
_MAX_BITS = 3322
"""The longest integer `calculator` keeps (about 1000 digits): beyond it products grow slow."""


def _value(node: ast.AST) -> int | float:
    """The number an arithmetic expression's node evaluates to; `ValueError` on anything else."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"an exponent above {_MAX_EXPONENT} is refused")
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, int) and abs(result).bit_length() > _MAX_BITS:
            raise ValueError("a result of more than 1000 digits is refused")
        return result
    raise ValueError(f"not arithmetic: {ast.unparse(node)!r}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, such as "(3 + 4) * 2".

    Returns:
        The value, or an error message beginning "Error:".

    Raises:
        Nothing: a failure is the "Error:" text it returns.

    Examples:
        >>> calculator("6 * 7"), calculator("2 ** 0.5")
        ('42', '1.4142135623730951')
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
        value = _value(tree.body)
    except ZeroDivisionError:
        return "Error: division by zero"
    except (SyntaxError, ValueError, OverflowError) as error:
        return f"Error: {error.msg if isinstance(error, SyntaxError) else error}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "Error: the value is not finite"
        if value.is_integer():
            return str(int(value))
    return str(value)
