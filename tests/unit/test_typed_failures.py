"""The request path branches on types, never on an error's code string (serve/outcome.py's rule):
a reworded code must not silently change what is retried."""

import re
from pathlib import Path

SERVE = Path(__file__).resolve().parents[2] / "serve"


def test_no_branch_in_serve_compares_an_error_code_as_a_string():
    compare = re.compile(r"\.code\s*(==|!=|in\b)|\bcode\s*==\s*[\"']")
    found = [f"{p.relative_to(SERVE)}:{n}: {line.strip()}" for p in SERVE.rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if compare.search(line)]
    assert not found, found

