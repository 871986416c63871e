"""The built-in tools, as a file of tool functions (``multi_turn.function_tool_path`` = this file):
the ``calculator`` of the built-in ``calculator`` task."""

from __future__ import annotations

import ast
import operator

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.USub: operator.neg, ast.UAdd: operator.pos}


def _value(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Mult) and max(abs(left), abs(right)) > 10**12:
            raise ValueError("numbers too large")
        return _OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_value(node.operand))
    raise ValueError("only numbers, + - * / and parentheses are allowed")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: Numbers with + - * / and parentheses, e.g. "123*45".
    """
    try:
        result = _value(ast.parse(expression.strip(), mode="eval").body)
    except ZeroDivisionError:
        return "Error: division by zero"
    except (SyntaxError, ValueError, TypeError) as e:
        return f"Error: {e}" if not isinstance(e, SyntaxError) else "Error: not an arithmetic expression"
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return str(result)
