"""A tiny local package for SWE tests: seeded into a package cache, so no download is needed."""

from __future__ import annotations

from pathlib import Path

CALC = {
    "calc/__init__.py": "from calc.ops import add, clamp, total_above\nfrom calc.text import shout, words\n",
    "calc/ops.py": '''"""Arithmetic helpers."""


def add(a, b):
    return a + b


def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def total_above(xs, n):
    total = 0
    count = 0
    for x in xs:
        if x > n:
            total += x
            count += 1
    return total
''',
    "calc/text.py": '''"""Text helpers."""


def shout(s):
    s = s.strip()
    return s.upper() + "!"


def words(s, limit):
    parts = s.split()
    parts = parts[:limit]
    return len(parts)
''',
    "tests/test_calc.py": '''from calc import add, clamp, shout, total_above, words


def test_add():
    assert add(2, 3) == 5


def test_add_negative():
    assert add(-2, -3) == -5


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_high():
    assert clamp(50, 0, 10) == 10


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_edges():
    assert clamp(0, 0, 10) == 0 and clamp(10, 0, 10) == 10


def test_total_above():
    assert total_above([1, 5, 7, 2], 4) == 12


def test_total_above_strict():
    assert total_above([4, 4, 5], 4) == 5


def test_shout():
    assert shout("  hi ") == "HI!"


def test_words():
    assert words("a b c d", 2) == 2


def test_words_all():
    assert words("a b c", 5) == 3
''',
}

SPEC = "calc==0.1"


def seed_cache(cache: Path, files: dict[str, str] = CALC, spec: str = SPEC) -> Path:
    """Write `files` as the unpacked sdist of `spec` in a package cache; return the cache."""
    name, version = spec.split("==")
    src = cache / f"{name}-{version}" / "src"
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    return cache
