"""The calculator toolset of ``envs.vf_calc``. verifiers serves a toolset as an MCP server by
running its module (``python -m envs.vf_calc_tools``), so it lives in a module of its own."""

from __future__ import annotations

import ast
import operator

import verifiers.v1 as vf

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.Pow: operator.pow,
}


def evaluate(expression: str) -> float:
    """Arithmetic only (numbers, + - * / **, parentheses): never Python's eval."""

    def walk(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")

    return walk(ast.parse(expression, mode="eval").body)


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None

    @vf.tool
    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression such as "12 * (3 + 4)"."""
        try:
            value = evaluate(expression)
        except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as exc:
            return f"error: {exc}"
        return str(int(value) if float(value).is_integer() else value)


if __name__ == "__main__":
    CalcToolset.run()
