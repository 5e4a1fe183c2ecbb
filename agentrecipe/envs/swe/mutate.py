"""Procedural bugs: AST mutations that each change one line of a source file.

Kinds (the first part of a SWE level name):

    op    a binary or boolean operator swapped      a + b  -> a - b,  x and y -> x or y
    cmp   a comparison swapped                      i < n  -> i <= n, a == b -> a != b, in -> not in
    obo   an integer constant off by one            xs[1:] -> xs[2:], range(n - 1) -> range(n - 2)
    var   a variable read replaced by another name  return seq -> return key   (a name of the same function)
    drop  a simple statement deleted                (only when the next line is a sibling statement)
    cond  an if / while / assert / ternary test inverted   if x: -> if not x:

Only statements inside functions, on one physical line, are mutated; the line is
rewritten by replacing the node's source segment with `ast.unparse` of the mutated
node, so the rest of the file keeps its formatting. Every mutation must leave a file
that still compiles (checked when a task keeps it). `fix_command` is the `edit` that
undoes it (what the expert does).
"""

from __future__ import annotations

import ast
import copy
import hashlib
from dataclasses import dataclass

KINDS = ("op", "cmp", "obo", "var", "drop", "cond")

_BINOPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult, ast.Div: ast.Mult,
           ast.Mod: ast.FloorDiv, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.LShift: ast.RShift,
           ast.RShift: ast.LShift, ast.Pow: ast.Mult}
_CMPOPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
           ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return)


@dataclass(frozen=True)
class Mutation:
    file: str
    line: int
    """1-based line of the file that changes (the deleted line for `drop`)."""
    kind: str
    original: str
    """The line as the package ships it (no newline)."""
    mutated: str | None
    """The line after mutation; None when the line is deleted (`drop`)."""

    @property
    def key(self) -> str:
        return f"{self.file}:{self.line}:{self.kind}:{self.mutated}"

    def bucket(self, n: int = 10) -> int:
        """A stable hash of the mutation in [0, n): assigns it to one split."""
        return int(hashlib.sha256(self.key.encode()).hexdigest(), 16) % n


def indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def apply(text: str, m: Mutation) -> str:
    """The file text with mutation `m` applied (the line must still be the original)."""
    lines = text.split("\n")
    if lines[m.line - 1] != m.original:
        raise ValueError(f"{m.file}:{m.line}: expected {m.original!r}, found {lines[m.line - 1]!r}")
    lines[m.line - 1 : m.line] = [] if m.mutated is None else [m.mutated]
    return "\n".join(lines)


def fix_command(m: Mutation) -> str:
    """The `edit` command that undoes `m` (insert the deleted line, or restore the changed one)."""
    end = m.line - 1 if m.mutated is None else m.line
    return f"edit {m.file} {m.line} {end} <<< {m.original.strip()}"


def _segment_line(line: str, node: ast.AST, new: ast.AST) -> str | None:
    if node.lineno != node.end_lineno:
        return None
    # col offsets are in UTF-8 bytes
    raw = line.encode()
    return (raw[: node.col_offset] + ast.unparse(new).encode() + raw[node.end_col_offset :]).decode()


def _segment(line: str, node: ast.AST) -> str:
    return line.encode()[node.col_offset : node.end_col_offset].decode()


def _function_names(fn: ast.AST) -> list[str]:
    """Names a function binds: its parameters and the names it assigns."""
    args = fn.args
    names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return sorted(names)


def _candidates_in_function(fn, lines: list[str], kinds: set[str]):
    """(kind, line, mutated line) for each mutation inside one function body."""
    local = _function_names(fn)
    for stmt_list_owner in ast.walk(fn):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(stmt_list_owner, field, None)
            if "drop" in kinds and isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                for s, nxt in zip(body, body[1:]):
                    if (isinstance(s, _SIMPLE) and s.lineno == s.end_lineno and nxt.lineno == s.lineno + 1
                            and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
                            and indent_of(lines[nxt.lineno - 1]) == indent_of(lines[s.lineno - 1])
                            and lines[s.lineno - 1].strip() == _segment(lines[s.lineno - 1], s)):
                        yield "drop", s.lineno, None
    for node in ast.walk(fn):
        if "cond" in kinds and isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            test = node.test
            if test.lineno == test.end_lineno:
                inverted = test.operand if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) else \
                    ast.UnaryOp(ast.Not(), test)
                yield "cond", test.lineno, _segment_line(lines[test.lineno - 1], test, inverted)
        if node is fn or not hasattr(node, "lineno") or node.lineno != getattr(node, "end_lineno", None):
            continue
        line = lines[node.lineno - 1]
        if "op" in kinds and isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            if not (isinstance(node.op, ast.Mod) and isinstance(node.left, (ast.Constant, ast.JoinedStr))):  # not '%' formatting
                new = copy.copy(node)
                new.op = _BINOPS[type(node.op)]()
                yield "op", node.lineno, _segment_line(line, node, new)
        if "op" in kinds and isinstance(node, ast.BoolOp):
            new = copy.copy(node)
            new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            yield "op", node.lineno, _segment_line(line, node, new)
        if "cmp" in kinds and isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMPOPS:
            new = copy.copy(node)
            new.ops = [_CMPOPS[type(node.ops[0])]()]
            yield "cmp", node.lineno, _segment_line(line, node, new)
        if ("obo" in kinds and isinstance(node, ast.Constant) and type(node.value) is int
                and abs(node.value) < 1000):
            for delta in (1, -1):
                yield "obo", node.lineno, _segment_line(line, node, ast.Constant(node.value + delta))
        if "var" in kinds and isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in local:
            others = [n for n in local if n != node.id and not n.startswith("_")]
            for other in others[:1]:
                yield "var", node.lineno, _segment_line(line, node, ast.Name(other, ast.Load()))


def candidates(file: str, text: str, kinds: set[str] | None = None, lines_allowed: set[int] | None = None
               ) -> list[Mutation]:
    """Every mutation of the chosen kinds in one file, sorted and deduplicated.

    `lines_allowed`: only these lines (e.g. those the tests execute). A rewritten node is
    `ast.unparse`d (which parenthesises as needed), so the file still parses; the task build
    compiles the mutated file of every mutation it keeps."""
    kinds = set(KINDS) if kinds is None else set(kinds)
    tree = ast.parse(text)
    lines = text.split("\n")
    found: dict[str, Mutation] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for kind, lineno, mutated in _candidates_in_function(fn, lines, kinds):
            if lines_allowed is not None and lineno not in lines_allowed:
                continue
            original = lines[lineno - 1]
            if mutated == original or (mutated is not None and "\n" in mutated) or "<<<" in original:
                continue
            m = Mutation(file, lineno, kind, original, mutated)
            found.setdefault(m.key, m)
    return sorted(found.values(), key=lambda m: (m.line, m.kind, m.mutated or ""))
