"""Answer extraction and the `math` verifier, the same rules as troupe's C++ `dataset` env
(envs/builtin/answer_extract.cpp, envs/builtin/math_equal.cpp), so a Python env scores exactly as
the built-in does. Both are tested on the same cases (tests/envs/extract_cases.jsonl,
tests/envs/math_corpus.jsonl); the rules are in docs/answers.md.

    from troupe_env.answers import extract, math_equal
    extract("He has 7+7=14.\\n#### 14", "gsm8k")        # -> "14"
    math_equal("\\\\frac{1}{2}", "0.5")                     # -> True
"""
import math
import re

__all__ = ["HOWS", "extract", "compile_pattern", "last_boxed", "math_equal", "math_normalize"]

HOWS = ("answer_tag", "last_number", "boxed", "gsm8k", "regex")

# ---- extraction ----

_NUMBER = re.compile(r"-?\d+(?:,\d{3}(?!\d))*(?:\.\d+)?(?:/\d+)?", re.ASCII)
_SPACE = " \t\n\r\f\v"


def _trim(s):
    return s.strip(_SPACE)


def _non_empty(s):
    s = _trim(s)
    return s if s else None


def _last_tag(text):
    # The last <answer> and the first </answer> after it (none: None), as troupe's extract_last_tag.
    start = text.rfind("<answer>")
    if start == -1:
        return None
    end = text.find("</answer>", start + 8)
    return None if end == -1 else _trim(text[start + 8:end])


def _answer_tag(text):
    tag = _last_tag(text)
    if tag is not None:
        return tag
    return _trim(text.split("\n", 1)[0])


def last_boxed(text):
    """Contents of the last \\boxed{...} or \\fbox{...} (braces balanced, untrimmed), or None."""
    best, open_at = -1, 0
    for name in ("\\boxed", "\\fbox"):
        at = text.find(name)
        while at != -1:
            brace = at + len(name)
            while brace < len(text) and text[brace] == " ":
                brace += 1
            if brace < len(text) and text[brace] == "{" and at > best:
                best, open_at = at, brace
            at = text.find(name, at + 1)
    if best == -1:
        return None
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1:i]
    return None


def _last_number(text):
    found = None
    for m in _NUMBER.finditer(text):
        s = m.group(0)
        if s[0] == "-" and m.start() > 0 and text[m.start() - 1].isascii() and text[m.start() - 1].isalnum():
            s = s[1:]
        found = s.replace(",", "")
    return found


def compile_pattern(pattern):
    """The compiled `pattern` of extract: regex; ValueError when it is invalid or has no group."""
    if not pattern:
        raise ValueError("extract: regex needs 'pattern' (a regex with one capture group)")
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise ValueError(f"'pattern' '{pattern}' is not a valid regex: {e}") from None
    if compiled.groups == 0:
        raise ValueError(f"'pattern' '{pattern}' has no capture group: the answer is group 1, e.g. 'Answer: (.+)'")
    return compiled


def extract(text, how="answer_tag", pattern=None):
    """The answer in `text` (trimmed), or None when there is none.

    how: answer_tag (the last <answer>...</answer>, else the first line), last_number (the last
    number, thousands commas dropped), boxed (the last \\boxed{...}), gsm8k (the text after the last
    '####', commas dropped) or regex (group 1 of the last match of `pattern`). ValueError for an
    unknown `how`, a bad pattern, or a pattern with another `how`."""
    if how not in HOWS:
        raise ValueError(f"extract: 'how' must be one of {', '.join(HOWS)} (got {how!r})")
    if how != "regex" and pattern:
        raise ValueError("'pattern' is only read with extract: regex")
    if how == "answer_tag":
        return _non_empty(_answer_tag(text))
    if how == "last_number":
        return _last_number(text)
    if how == "boxed":
        box = last_boxed(text)
        return None if box is None else _non_empty(box)
    if how == "gsm8k":
        at = text.rfind("####")
        return None if at == -1 else _non_empty(text[at + 4:].replace(",", ""))
    compiled = pattern if isinstance(pattern, re.Pattern) else compile_pattern(pattern)
    found = None
    for m in compiled.finditer(text):
        found = m.group(1)
    return None if found is None else _non_empty(found)


# ---- math equivalence ----

_LIMIT = 2**63 - 1   # an exact value's numerator and denominator stay within int64 (as in C++)
_POINTS = 3          # points an expression in letters is evaluated at
_MAX_LEN = 1000      # longer answers are compared as strings
_MAX_DEPTH = 64
_MAX_SET = 64        # larger sets are compared in order
_REPLACEMENTS = [
    ("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", " "), ("\\;", " "), ("\\:", " "), ("\\ ", " "),
    ("~", " "), ("\\displaystyle", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\dbinom", "\\binom"), ("\\tbinom", "\\binom"), ("\\%", "%"),
    ("\\$", ""), ("$", ""), ("^\\circ", ""), ("^{\\circ}", ""), ("\\circ", ""), ("\u00b0", ""),
    ("{,}", ","), ("\\cdot", "*"), ("\\times", "*"), ("\\div", "/")]
_TEXT_COMMANDS = ("\\text", "\\textbf", "\\textrm", "\\mathrm", "\\mathbf", "\\mbox")


def _is_digit(c):
    return "0" <= c <= "9"


def _is_letter(c):
    return "a" <= c <= "z" or "A" <= c <= "Z"


def _replace_all(s, old, new):
    # Left to right, resuming after each replacement (as the C++ does).
    at = s.find(old)
    while at != -1:
        s = s[:at] + new + s[at + len(old):]
        at = s.find(old, at + len(new))
    return s


def _unwrap_text_commands(s):
    for cmd in _TEXT_COMMANDS:
        opening = cmd + "{"
        at = s.find(opening)
        while at != -1:
            i, depth = at + len(opening), 1
            while i < len(s) and depth > 0:
                depth += 1 if s[i] == "{" else (-1 if s[i] == "}" else 0)
                i += 1
            if depth != 0:
                return s
            s = s[:at] + " " + s[at + len(opening):i - 1] + " " + s[i:]
            at = s.find(opening, at)
    return s


def _is_unit_word(word):
    n = 0
    while n < len(word) and _is_letter(word[n]):
        n += 1
    return n > 0 and word[n:] in ("", "^2", "^3", "^{2}", "^{3}")


def _strip_unit_words(s):
    # Trailing words of letters (units: "cm", "dollars", "square feet") after a number are dropped.
    head, dropped = _trim(s), False
    while True:
        sp = max(head.rfind(c) for c in " \t\n\r")
        if sp == -1 or not _is_unit_word(head[sp + 1:]):
            break
        head, dropped = _trim(head[:sp]), True
    last = head[-1] if head else ""
    return head if dropped and (_is_digit(last) or last in ("}", ")", "%", ".")) else s


def _drop_thousands_commas(s):
    out = []
    for i, c in enumerate(s):
        sep = (c == "," and i > 0 and _is_digit(s[i - 1]) and i + 3 < len(s) and _is_digit(s[i + 1])
               and _is_digit(s[i + 2]) and _is_digit(s[i + 3]) and (i + 4 == len(s) or not _is_digit(s[i + 4])))
        if not sep:
            out.append(c)
    return "".join(out)


def math_normalize(text):
    """The normal form math_equal compares (see math_equal.h for the steps)."""
    s = text
    box = last_boxed(s)
    if box is not None:
        s = box
    for old, new in _REPLACEMENTS:
        s = _replace_all(s, old, new)
    s = _unwrap_text_commands(s)
    s = _strip_unit_words(s)
    s = _drop_thousands_commas(s)
    s = "".join(c for c in s if c not in " \t\n\r")
    while len(s) > 1 and s[-1] == ".":
        s = s[:-1]
    return s


class _Num:
    __slots__ = ("exact", "num", "den", "d", "decimal")

    def __init__(self, exact, num, den, d, decimal):
        self.exact, self.num, self.den, self.d, self.decimal = exact, num, den, d, decimal


def _real(d, decimal):
    return _Num(False, 0, 1, d, decimal)


def _i128_to_double(v):
    return float(v)  # an int below 2**127 converts correctly rounded, as the C++ cast does


def _rational(p, q, decimal):
    if q < 0:
        p, q = -p, -q
    g = math.gcd(p, q)
    if g > 1:
        p, q = p // g, q // g
    if p > _LIMIT or p < -_LIMIT or q > _LIMIT:
        return _real(_i128_to_double(p) / _i128_to_double(q), decimal)
    return _Num(True, p, q, float(p) / float(q), decimal)


def _combine(a, b, op):
    dec = a.decimal or b.decimal
    if op == "/" and ((b.exact and b.num == 0) or (not b.exact and b.d == 0)):
        return None
    if a.exact and b.exact:
        if op == "+":
            return _rational(a.num * b.den + b.num * a.den, a.den * b.den, dec)
        if op == "-":
            return _rational(a.num * b.den - b.num * a.den, a.den * b.den, dec)
        if op == "*":
            return _rational(a.num * b.num, a.den * b.den, dec)
        return _rational(a.num * b.den, a.den * b.num, dec)
    try:
        r = a.d + b.d if op == "+" else a.d - b.d if op == "-" else a.d * b.d if op == "*" else a.d / b.d
    except (OverflowError, ZeroDivisionError):
        return None
    return _real(r, dec) if math.isfinite(r) else None


def _round6_exact(x):
    return (x.num * 2000000 + x.den) // (x.den * 2)


def _power(base, e):
    dec = base.decimal or e.decimal
    if base.exact and e.exact and e.den == 1 and -64 <= e.num <= 64:
        if base.num == 0 and e.num < 0:
            return None
        r = _rational(1, 1, dec)
        b = _rational(base.den, base.num, dec) if e.num < 0 else base
        for _ in range(abs(e.num)):
            r = _combine(r, b, "*")
            if r is None:
                return None
        return r
    try:
        v = math.pow(base.d, e.d)
    except (OverflowError, ValueError):
        return None
    return _real(v, dec) if math.isfinite(v) else None


def _exact_root(v, n):
    if v < 0:
        return None
    guess = round(math.pow(float(v), 1.0 / n))
    for r in range(guess - 1 if guess > 0 else 0, guess + 2):
        p = 1
        for _ in range(n):
            if p > v:
                break
            p *= r
        if p == v:
            return r
    return None


def _root(x, index):
    if not index.exact or index.den != 1 or index.num < 2 or index.num > 64:
        return None
    n = index.num
    if x.exact and x.num >= 0:
        p, q = _exact_root(x.num, n), _exact_root(x.den, n)
        if p is not None and q is not None:
            return _rational(p, q, x.decimal or index.decimal)
    if x.d < 0 and n % 2 == 0:
        return None
    if x.d < 0:
        v = -math.pow(-x.d, 1.0 / n)
    else:
        v = math.sqrt(x.d) if n == 2 else math.pow(x.d, 1.0 / n)
    return _real(v, x.decimal or index.decimal)


def _factorial(n):
    if not n.exact or n.den != 1 or n.num < 0 or n.num > 20:
        return None
    return _rational(math.factorial(n.num), 1, n.decimal)


def _binomial(n, k):
    if not n.exact or not k.exact or n.den != 1 or k.den != 1 or k.num < 0 or n.num < k.num or n.num > 1000:
        return None
    r = _rational(1, 1, False)
    for i in range(1, k.num + 1):
        r = _combine(r, _rational(n.num - k.num + i, i, False), "*")
        if r is None:
            return None
    return r


def _variable_value(name, k):
    h = 1469598103934665603  # FNV-1a, 64-bit
    for c in name.encode():
        h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return 0.5 + float((h >> 11) % 1000) / 997.0 + 0.713 * k


class _Scalar:
    """expr := term (('+'|'-') term)*; term := factor (('*'|'/') factor | factor)*; factor :=
    ('-'|'+') factor | atom ('^' factor)?; atom := number | (expr) | {expr} | \\frac A A |
    \\sqrt[expr]? A | \\pi | letter | \\command; A := {expr} | digit | letter."""

    def __init__(self, s, point):
        self.s, self.point, self.i, self.vars = s, point, 0, set()

    def parse(self):
        v = self.expr(0)
        return v if v is not None and self.i == len(self.s) else None

    def at(self, c):
        return self.i < len(self.s) and self.s[self.i] == c

    def expr(self, depth):
        if depth > _MAX_DEPTH:
            return None
        v = self.term(depth)
        while v is not None and (self.at("+") or self.at("-")):
            op = self.s[self.i]
            self.i += 1
            rhs = self.term(depth)
            if rhs is None:
                return None
            v = _combine(v, rhs, op)
        return v

    def starts_atom(self):
        return self.i < len(self.s) and (self.s[self.i] in "({\\" or _is_letter(self.s[self.i]))

    def term(self, depth):
        v = self.factor(depth + 1)
        while v is not None:
            if self.at("*") or self.at("/"):
                op = self.s[self.i]
                self.i += 1
            elif self.starts_atom():
                op = "*"
            else:
                break
            rhs = self.factor(depth + 1)
            if rhs is None:
                return None
            v = _combine(v, rhs, op)
        return v

    def factor(self, depth):
        if depth > _MAX_DEPTH:
            return None
        if self.at("-") or self.at("+"):
            neg = self.s[self.i] == "-"
            self.i += 1
            v = self.factor(depth + 1)
            if v is None or not neg:
                return v
            return _combine(_rational(0, 1, False), v, "-")
        base = self.atom(depth)
        while base is not None and self.at("!"):
            self.i += 1
            base = _factorial(base)
        if base is None or not self.at("^"):
            return base
        self.i += 1
        e = self.group(depth) if self.at("{") else self.factor(depth + 1)
        if e is None:
            return None
        return _power(base, e)

    def group(self, depth):
        if self.at("{"):
            self.i += 1
            v = self.expr(depth + 1)
            if v is None or not self.at("}"):
                return None
            self.i += 1
            return v
        if self.i < len(self.s) and _is_digit(self.s[self.i]):
            self.i += 1
            return _rational(ord(self.s[self.i - 1]) - 48, 1, False)
        if self.i < len(self.s) and _is_letter(self.s[self.i]):
            self.i += 1
            return self.variable(self.s[self.i - 1])
        return None

    def variable(self, name):
        self.vars.add(name)
        return _real(_variable_value(name, self.point), False)

    def number(self):
        start, n, d, dot, big = self.i, 0, 1, False, False
        while self.i < len(self.s) and (_is_digit(self.s[self.i]) or (self.s[self.i] == "." and not dot)):
            c = self.s[self.i]
            self.i += 1
            if c == ".":
                dot = True
                continue
            if n > _LIMIT or d > _LIMIT:
                big = True
                continue
            n = n * 10 + ord(c) - 48
            if dot:
                d *= 10
        text = self.s[start:self.i]
        if text == ".":
            return None
        if big:
            return _real(float(text), dot)
        return _rational(n, d, dot)

    def command(self, depth):
        if self.s.startswith("\\binom", self.i):
            self.i += 6
            n = self.group(depth)
            k = self.group(depth) if n is not None else None
            return None if k is None else _binomial(n, k)
        if self.s.startswith("\\frac", self.i):
            self.i += 5
            a = self.group(depth)
            b = self.group(depth) if a is not None else None
            return None if b is None else _combine(a, b, "/")
        if self.s.startswith("\\sqrt", self.i):
            self.i += 5
            index = _rational(2, 1, False)
            if self.at("["):
                self.i += 1
                n = self.expr(depth + 1)
                if n is None or not self.at("]"):
                    return None
                self.i += 1
                index = n
            x = self.group(depth)
            return None if x is None else _root(x, index)
        start = self.i
        self.i += 1
        while self.i < len(self.s) and _is_letter(self.s[self.i]):
            self.i += 1
        name = self.s[start:self.i]
        if name == "\\":
            return None
        if name == "\\pi":
            return _real(math.pi, False)
        return self.variable(name)

    def atom(self, depth):
        if self.i >= len(self.s):
            return None
        c = self.s[self.i]
        if c in "({":
            close = ")" if c == "(" else "}"
            self.i += 1
            v = self.expr(depth + 1)
            if v is None or not self.at(close):
                return None
            self.i += 1
            return v
        if _is_digit(c) or c == ".":
            return self.number()
        if c == "\\":
            return self.command(depth)
        if _is_letter(c):
            self.i += 1
            return self.variable(c)
        return None


def _near(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, max(abs(a), abs(b)))


def _numbers_equal(a, b):
    if a.decimal or b.decimal:
        if a.exact and b.exact:
            return _round6_exact(a) == _round6_exact(b)
        if abs(a.d) < 1e9 and abs(b.d) < 1e9:
            return math.floor(a.d * 1e6 + 0.5) == math.floor(b.d * 1e6 + 0.5)
        return _near(a.d, b.d)
    if a.exact and b.exact:
        return a.num == b.num and a.den == b.den
    return _near(a.d, b.d)


def _scalar_text(s):
    return (s[:-1], True) if s.endswith("%") else (s, False)


def _scalars_equal(answer, reference):
    """None when either side is not an expression of the grammar (then strings decide)."""
    (a, a_pct), (r, r_pct) = _scalar_text(answer), _scalar_text(reference)
    pa, pr = _Scalar(a, 0), _Scalar(r, 0)
    va, vr = pa.parse(), pr.parse()
    if va is None or vr is None:
        return None
    if pa.vars or pr.vars:
        if pa.vars != pr.vars or a_pct or r_pct:
            return False
        for k in range(1, _POINTS + 1):
            x, y = _Scalar(a, k).parse(), _Scalar(r, k).parse()
            if x is None or y is None or not _near(x.d, y.d):
                return False
        return True
    hundred = _rational(100, 1, False)
    as_ = [va] + ([_combine(va, hundred, "/")] if a_pct else [])
    rs = [vr] + ([_combine(vr, hundred, "/")] if r_pct else [])
    return any(_numbers_equal(x, y) for x in as_ for y in rs)


def _elements_equal(a, b):
    return a == b or bool(_scalars_equal(a, b))


def _split_top_level(s):
    out, depth = [""], 0
    for c in s:
        if c in "([{":
            depth += 1
        if c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            out.append("")
        else:
            out[-1] += c
    return out


def _wraps_whole(s):
    depth = 0
    for i, c in enumerate(s):
        if c in "([{":
            depth += 1
        if c in ")]}":
            depth -= 1
        if depth == 0:
            return i + 1 == len(s)
    return False


def _structure_of(s):
    """("scalar"|"set"|"tuple", open, close, items)."""
    if len(s) >= 4 and s.startswith("\\{") and s.endswith("\\}") and _wraps_whole(s[1:]):
        return ("set", "", "", _split_top_level(s[2:-2]))
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _wraps_whole(s):
        items = _split_top_level(s[1:-1])
        if len(items) > 1:
            return ("tuple", s[0], s[-1], items)
    items = _split_top_level(s)
    if len(items) > 1:
        return ("set", "", "", items)
    return ("scalar", "", "", [])


def _ordered_equal(a, b):
    return len(a) == len(b) and all(_elements_equal(x, y) for x, y in zip(a, b))


def _unordered_equal(a, b):
    if len(a) != len(b):
        return False
    if len(a) > _MAX_SET:  # larger sets are compared in order (bounded time)
        return _ordered_equal(a, b)
    used = [False] * len(b)
    for x in a:
        for j, y in enumerate(b):
            if not used[j] and _elements_equal(x, y):
                used[j] = True
                break
        else:
            return False
    return True


def _split_assignment(s):
    if len(s) >= 3 and _is_letter(s[0]) and s[1] == "=" and s.find("=", 2) == -1:
        return s[0], s[2:]
    return "", s


def math_equal(answer, reference):
    """Whether `answer` is mathematically `reference`: numbers, fractions, decimals (rounded to 6
    places), percentages (50% == 50 == 0.5), LaTeX (\\frac, \\dfrac, \\sqrt, \\boxed, \\text{}), simple
    expressions (exact where possible, in letters at three fixed points), sets (any order), tuples
    and intervals (in order), units and thousands separators dropped; otherwise normalised strings."""
    if len(answer.encode()) > _MAX_LEN or len(reference.encode()) > _MAX_LEN:  # bytes, as in C++
        return _trim(answer) == _trim(reference)
    a_name, a = _split_assignment(math_normalize(answer))
    r_name, r = _split_assignment(math_normalize(reference))
    if not a or not r:
        return False
    if a_name and r_name and a_name != r_name:
        return False
    if a == r:
        return True
    sa, sr = _structure_of(a), _structure_of(r)
    if sa[0] == "scalar" and sr[0] == "scalar":
        return bool(_scalars_equal(a, r))
    if sa[0] == "tuple" and sr[0] == "tuple":
        return sa[1] == sr[1] and sa[2] == sr[2] and _ordered_equal(sa[3], sr[3])
    if sa[0] == "set" and sr[0] == "set":
        return _unordered_equal(sa[3], sr[3])
    if sa[0] == "scalar" and sr[0] == "set":  # a one-element set {v} against v
        return _unordered_equal([a], sr[3])
    if sr[0] == "scalar" and sa[0] == "set":
        return _unordered_equal(sa[3], [r])
    bare_a = sa[0] == "set" and not a.startswith("\\{")
    bare_r = sr[0] == "set" and not r.startswith("\\{")
    if (bare_a and sr[0] == "tuple") or (bare_r and sa[0] == "tuple"):
        return _ordered_equal(sa[3], sr[3])
    return False
