"""kubectl's JSONPath templates, for ``-o jsonpath=...`` and ``-o custom-columns=...``.

Scripts written against ``kubectl get -o jsonpath`` should work unchanged on dispatch's JSON, so this
follows kubectl's dialect (k8s.io/client-go/util/jsonpath), not RFC 9535: text with ``{...}`` actions;
``{range EXPR}...{end}``; ``{"literal"}`` with ``\\n`` and ``\\t``; paths of ``.field``, ``..field``,
``[n]``, ``[a:b:c]``, ``[*]``, ``.*``, ``['key']``, ``[a,b]``, ``[?(@.x == "y")]``; ``\\.`` escapes a dot in
a key (label keys). A missing key prints nothing, as kubectl's default ``--allow-missing-template-keys``.
The template is parsed when the option is read, so a bad one is a usage error before any request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any


class TemplateError(ValueError):
    """A template that does not parse; the message says where."""


# ------------------------------------------------------------------------------------------------ paths


@dataclass(frozen=True)
class _Field:
    name: str  # "*" for every child


@dataclass(frozen=True)
class _Recursive:
    name: str  # "*" for every descendant


@dataclass(frozen=True)
class _Slice:
    start: int | None
    stop: int | None
    step: int | None


@dataclass(frozen=True)
class _Union:
    keys: tuple[int | str, ...]


@dataclass(frozen=True)
class _Filter:
    left: Path
    op: str  # "" for existence
    right: Path | str | float | bool | None


@dataclass(frozen=True)
class Path:
    """One path expression; ``root`` when it starts at ``$`` rather than at the current item."""

    steps: tuple[_Field | _Recursive | _Slice | _Union | _Filter, ...]
    root: bool = False

    def find(self, current: Any, root: Any) -> list[Any]:
        nodes = [root if self.root else current]
        for step in self.steps:
            nodes = [out for node in nodes for out in _apply(step, node, root)]
        return nodes


_NAME = re.compile(r"(?:\\.|[^.\[\]\s\\])+")
_OPS = ("==", "!=", "<=", ">=", "<", ">")


def parse_path(text: str) -> Path:
    """A path such as ``.items[*].name`` or ``$.a..b`` (what sits inside ``{...}``, or a custom column)."""
    src = text.strip()
    if not src:
        raise TemplateError("empty path")
    i = 0
    root = False
    if src[0] in "$@":
        root = src[0] == "$"
        i = 1
    steps: list[_Field | _Recursive | _Slice | _Union | _Filter] = []
    while i < len(src):
        ch = src[i]
        if src.startswith("..", i):
            name, i = _name_at(src, i + 2, "a name must follow '..'")
            steps.append(_Recursive(name))
        elif ch == ".":
            i += 1
            if i >= len(src) or src[i] == "[":
                continue  # '.' alone (the current item), or '.[0]'
            name, i = _name_at(src, i, "a field name must follow '.'")
            steps.append(_Field(name))
        elif ch == "[":
            close = _closing(src, i)
            steps.append(_bracket(src[i + 1 : close].strip(), src))
            i = close + 1
        else:
            raise TemplateError(f"unexpected {ch!r} at {i} in {src!r} (a path starts with '.', '$' or '@')")
    return Path(tuple(steps), root)


def _name_at(src: str, i: int, missing: str) -> tuple[str, int]:
    """The name (or ``*``, every one) a '.' or '..' is followed by at ``i``, and where it ends."""
    if i < len(src) and src[i] == "*":
        return "*", i + 1
    m = _NAME.match(src, i)
    if not m:
        raise TemplateError(f"{missing} at {i} in {src!r}")
    return _unescape(m.group()), m.end()


def _unescape(name: str) -> str:
    return re.sub(r"\\(.)", r"\1", name)


def _closing(src: str, start: int) -> int:
    depth = 0
    quote = ""
    for j in range(start, len(src)):
        ch = src[j]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
            if depth == 0:
                return j
    raise TemplateError(f"unclosed '[' at {start} in {src!r}")


def _bracket(inner: str, src: str) -> _Field | _Slice | _Union | _Filter:
    if inner == "*":
        return _Field("*")
    if inner.startswith("?"):
        m = re.fullmatch(r"\?\s*\((.*)\)", inner, re.DOTALL)
        if not m:
            raise TemplateError(f"a filter is [?(...)]: {inner!r} in {src!r}")
        return _filter(m.group(1).strip(), src)
    if ":" in inner and not inner.startswith(("'", '"')):
        parts = inner.split(":")
        if len(parts) > 3:
            raise TemplateError(f"a slice is [start:stop:step]: {inner!r} in {src!r}")
        try:
            nums = [int(p) if p.strip() else None for p in parts] + [None] * (3 - len(parts))
        except ValueError:
            raise TemplateError(f"a slice takes integers: {inner!r} in {src!r}") from None
        if nums[2] == 0:
            raise TemplateError(f"a slice's step cannot be 0: {inner!r} in {src!r}")
        return _Slice(nums[0], nums[1], nums[2])
    keys: list[int | str] = []
    for part in _split_commas(inner):
        part = part.strip()
        if len(part) >= 2 and part[0] == part[-1] and part[0] in "'\"":
            keys.append(part[1:-1])
        else:
            try:
                keys.append(int(part))
            except ValueError:
                raise TemplateError(f"an index is an integer or a quoted key: {part!r} in {src!r}") from None
    if not keys:
        raise TemplateError(f"empty [] in {src!r}")
    return _Union(tuple(keys))


def _split_commas(text: str) -> list[str]:
    out, cur, quote = [], "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == ",":
            out.append(cur)
            cur = ""
            continue
        cur += ch
    out.append(cur)
    return out


def _filter(expr: str, src: str) -> _Filter:
    for op in _OPS:
        at = _outside_quotes(expr, op)
        if at >= 0:
            left, right = expr[:at].strip(), expr[at + len(op) :].strip()
            return _Filter(_operand_path(left, src), op, _operand(right, src))
    return _Filter(_operand_path(expr, src), "", None)


def _outside_quotes(text: str, needle: str) -> int:
    quote = ""
    for j, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif text.startswith(needle, j):
            return j
    return -1


def _operand_path(text: str, src: str) -> Path:
    if not text.startswith(("@", "$")):
        raise TemplateError(f"a filter compares a path starting with '@' or '$': {text!r} in {src!r}")
    return parse_path(text)


def _operand(text: str, src: str) -> Path | str | float | bool | None:
    if text.startswith(("@", "$")):
        return parse_path(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    try:
        return float(text)
    except ValueError:
        raise TemplateError(f"a filter compares with a quoted string, a number or a path: {text!r} "
                            f"in {src!r}") from None


def _children(node: Any) -> list[Any]:
    if isinstance(node, dict):
        return [node[k] for k in sorted(node)]
    if isinstance(node, list):
        return list(node)
    return []


def _descendants(node: Any) -> Iterator[Any]:
    yield node
    for child in _children(node):
        yield from _descendants(child)


def _apply(step: _Field | _Recursive | _Slice | _Union | _Filter, node: Any, root: Any) -> list[Any]:
    if isinstance(step, _Field):
        if step.name == "*":
            return _children(node)
        return [node[step.name]] if isinstance(node, dict) and step.name in node else []
    if isinstance(step, _Recursive):
        found = []
        for d in _descendants(node):
            if step.name == "*":
                found.extend(_children(d))
            elif isinstance(d, dict) and step.name in d:
                found.append(d[step.name])
        return found
    if isinstance(step, _Slice):
        return list(node[step.start : step.stop : step.step]) if isinstance(node, list) else []
    if isinstance(step, _Union):
        out = []
        for key in step.keys:
            indexed = isinstance(key, int) and isinstance(node, list) and -len(node) <= key < len(node)
            keyed = isinstance(key, str) and isinstance(node, dict) and key in node
            if indexed or keyed:
                out.append(node[key])
        return out
    items = node if isinstance(node, list) else [node] if isinstance(node, dict) else []
    return [item for item in items if _holds(step, item, root)]


def _holds(f: _Filter, item: Any, root: Any) -> bool:
    left = f.left.find(item, root)
    if not f.op:
        return bool(left) and left[0] not in (None, False, "", [], {})
    right = f.right.find(item, root) if isinstance(f.right, Path) else [f.right]
    if not left or not right:
        return False
    a, b = left[0], right[0]
    if isinstance(b, float) and isinstance(a, (int, float)) and not isinstance(a, bool):
        a = float(a)
    if f.op == "==":
        return bool(a == b)
    if f.op == "!=":
        return bool(a != b)
    try:
        return bool({"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[f.op])
    except TypeError:
        return False


# -------------------------------------------------------------------------------------------- templates


@dataclass(frozen=True)
class _Text:
    text: str


@dataclass(frozen=True)
class _Expr:
    path: Path


@dataclass(frozen=True)
class _Range:
    path: Path
    body: tuple[_Text | _Expr | _Range, ...]


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}


@dataclass(frozen=True)
class Template:
    """A parsed kubectl JSONPath template."""

    source: str
    body: tuple[_Text | _Expr | _Range, ...]

    def render(self, data: Any) -> str:
        return "".join(_render(self.body, data, data))


def parse_template(source: str) -> Template:
    """Parse ``source``; raise TemplateError naming what is wrong."""
    if not source:
        raise TemplateError("the template is empty")
    pieces = _lex(source)
    body, rest = _block(pieces, 0, source)
    if rest != len(pieces):
        raise TemplateError(f"{{end}} without {{range}} in {source!r}")
    return Template(source, tuple(body))


def _lex(source: str) -> list[tuple[str, str]]:
    """(kind, text) pieces: ("text", ...) or ("action", inside the braces)."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(source):
        start = source.find("{", i)
        if start < 0:
            out.append(("text", source[i:]))
            break
        if start > i:
            out.append(("text", source[i:start]))
        j, quote = start + 1, ""
        while j < len(source):
            ch = source[j]
            if quote:
                if ch == "\\":
                    j += 1
                elif ch == quote:
                    quote = ""
            elif ch in "'\"":
                quote = ch
            elif ch == "}":
                break
            j += 1
        if j >= len(source):
            raise TemplateError(f"unclosed '{{' at {start} in {source!r}")
        out.append(("action", source[start + 1 : j].strip()))
        i = j + 1
    return out


def _block(pieces: Sequence[tuple[str, str]], i: int, source: str) -> tuple[list[_Text | _Expr | _Range], int]:
    body: list[_Text | _Expr | _Range] = []
    while i < len(pieces):
        kind, text = pieces[i]
        if kind == "text":
            body.append(_Text(text))
        elif text == "end":
            return body, i
        elif text.startswith("range ") or text == "range":
            inner, at = _block(pieces, i + 1, source)
            if at >= len(pieces):
                raise TemplateError(f"{{range}} without {{end}} in {source!r}")
            body.append(_Range(parse_path(text[len("range"):].strip() or "@"), tuple(inner)))
            i = at
        elif len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            body.append(_Text(re.sub(r"\\(.)", lambda m: _ESCAPES.get(m[1], m[0]), text[1:-1])))
        elif not text:
            raise TemplateError(f"empty {{}} in {source!r}")
        else:
            body.append(_Expr(parse_path(text)))
        i += 1
    return body, i


def _render(body: Sequence[_Text | _Expr | _Range], current: Any, root: Any) -> Iterator[str]:
    for part in body:
        if isinstance(part, _Text):
            yield part.text
        elif isinstance(part, _Expr):
            yield " ".join(scalar(v) for v in part.path.find(current, root))
        else:
            for item in part.path.find(current, root):
                # a range over a list ranges over its elements, as kubectl's does
                for each in item if isinstance(item, list) else [item]:
                    yield from _render(part.body, each, root)


def scalar(value: Any) -> str:
    """A value as kubectl prints it: strings bare, null as nothing, the rest as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))
