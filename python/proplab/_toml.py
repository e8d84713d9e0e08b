"""TOML for the resolved study text a run file stores (its `config` attribute, docs/studies.md "The resolved study").

`parse_toml` uses the standard library's tomllib (Python >= 3.11), else tomli when it is installed, else the small
parser below. That parser reads the TOML that proplab writes and the `[sweep]` tables users write: tables and
dotted table headers, bare, quoted and dotted keys, basic and literal strings, integers, floats, booleans, arrays
(nested, across lines) and inline tables. Dates, multi-line strings and arrays of tables are not proplab study
syntax and are refused with a ValueError naming the line.
"""

import math
import re

try:  # Python >= 3.11
    import tomllib as _toml_library
except ImportError:  # pragma: no cover - depends on the interpreter
    try:
        import tomli as _toml_library
    except ImportError:
        _toml_library = None


def parse_toml(text):
    """The TOML document `text` as a dict. ValueError (with the line) when it is not valid."""
    if _toml_library is not None:
        try:
            return _toml_library.loads(text)
        except _toml_library.TOMLDecodeError as error:
            raise ValueError(str(error)) from None
    return parse_toml_minimal(text)


def parse_toml_minimal(text):
    """The fallback parser (module docstring); public so that it can be tested beside tomllib."""
    return _Parser(text).document()


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_NUMBER = re.compile(r"[+-]?(inf|nan|0x[0-9A-Fa-f_]+|0o[0-7_]+|0b[01_]+|[0-9_]+(\.[0-9_]+)?([eE][+-]?[0-9_]+)?)")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


class _Parser:
    def __init__(self, text):
        self.text = text
        self.pos = 0

    def error(self, message):
        line = self.text.count("\n", 0, self.pos) + 1
        raise ValueError("TOML line %d: %s" % (line, message))

    def peek(self):
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip_space(self, newlines=False):
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in " \t\r" or (newlines and c == "\n"):
                self.pos += 1
            elif c == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            else:
                return

    def expect(self, c):
        if self.peek() != c:
            self.error("expected %r, found %r" % (c, self.peek() or "end of text"))
        self.pos += 1

    def end_of_line(self):
        self.skip_space()
        if self.pos < len(self.text):
            self.expect("\n")

    def document(self):
        root = {}
        table = root
        while True:
            self.skip_space(newlines=True)
            if self.pos >= len(self.text):
                return root
            if self.peek() == "[":
                self.pos += 1
                if self.peek() == "[":
                    self.error("arrays of tables are not study syntax")
                self.skip_space()
                table = self.descend(root, self.key())
                self.skip_space()
                self.expect("]")
                self.end_of_line()
            else:
                self.key_value(table)
                self.end_of_line()

    def descend(self, table, path):
        for part in path:
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                self.error("key %s is not a table" % ".".join(path))
        return table

    def key(self):
        parts = []
        while True:
            self.skip_space()
            c = self.peek()
            if c == '"':
                parts.append(self.basic_string())
            elif c == "'":
                parts.append(self.literal_string())
            else:
                match = _BARE_KEY.match(self.text, self.pos)
                if not match:
                    self.error("expected a key")
                parts.append(match.group())
                self.pos = match.end()
            self.skip_space()
            if self.peek() != ".":
                return parts
            self.pos += 1

    def key_value(self, table):
        path = self.key()
        self.expect("=")
        self.skip_space()
        target = self.descend(table, path[:-1])
        if path[-1] in target:
            self.error("key %s defined twice" % ".".join(path))
        target[path[-1]] = self.value()

    def value(self):
        c = self.peek()
        if c == '"':
            if self.text.startswith('"""', self.pos):
                self.error("multi-line strings are not study syntax")
            return self.basic_string()
        if c == "'":
            return self.literal_string()
        if c == "[":
            return self.array()
        if c == "{":
            return self.inline_table()
        for word, result in (("true", True), ("false", False)):
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return result
        match = _NUMBER.match(self.text, self.pos)
        if not match:
            self.error("expected a value")
        self.pos = match.end()
        if self.peek() in ("-", ":"):
            self.error("dates and times are not study syntax")
        return _number(match.group())

    def basic_string(self):
        self.expect('"')
        out = []
        while True:
            c = self.peek()
            if c in ("", "\n"):
                self.error("unterminated string")
            self.pos += 1
            if c == '"':
                return "".join(out)
            if c != "\\":
                out.append(c)
                continue
            e = self.peek()
            self.pos += 1
            if e in _ESCAPES:
                out.append(_ESCAPES[e])
            elif e in ("u", "U"):
                digits = 4 if e == "u" else 8
                out.append(chr(int(self.text[self.pos:self.pos + digits], 16)))
                self.pos += digits
            else:
                self.error("unknown escape \\%s" % e)

    def literal_string(self):
        self.expect("'")
        end = self.text.find("'", self.pos)
        if end < 0 or "\n" in self.text[self.pos:end]:
            self.error("unterminated string")
        value = self.text[self.pos:end]
        self.pos = end + 1
        return value

    def array(self):
        self.expect("[")
        items = []
        while True:
            self.skip_space(newlines=True)
            if self.peek() == "]":
                self.pos += 1
                return items
            items.append(self.value())
            self.skip_space(newlines=True)
            if self.peek() == ",":
                self.pos += 1
            elif self.peek() != "]":
                self.error("expected ',' or ']' in an array")

    def inline_table(self):
        self.expect("{")
        table = {}
        self.skip_space()
        if self.peek() == "}":
            self.pos += 1
            return table
        while True:
            self.key_value(table)
            self.skip_space()
            if self.peek() == "}":
                self.pos += 1
                return table
            self.expect(",")


def _number(text):
    clean = text.replace("_", "")
    sign = -1 if clean.startswith("-") else 1
    body = clean.lstrip("+-")
    if body in ("inf", "nan"):
        return sign * math.inf if body == "inf" else math.nan
    for prefix, base in (("0x", 16), ("0o", 8), ("0b", 2)):
        if body.startswith(prefix):
            return sign * int(body[2:], base)
    if any(c in body for c in ".eE"):
        return float(clean)
    return int(clean)
