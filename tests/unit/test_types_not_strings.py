"""Types where strings decide: the request path branches on exception types, never on an error's
code string (a reworded code must not silently change what is retried), and the trace record is
a type kept equal to the store's schema."""

import re
from pathlib import Path

SERVE = Path(__file__).resolve().parents[2] / "serve"


def test_no_branch_in_serve_compares_an_error_code_as_a_string():
    compare = re.compile(r"\.code\s*(==|!=|in\b)|\bcode\s*==\s*[\"']")
    found = [
        f"{p.relative_to(SERVE)}:{n}: {line.strip()}"
        for p in SERVE.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if compare.search(line)
    ]
    assert not found, found


def test_the_trace_record_type_is_the_stores_schema():
    """A field added to one and not the other fails here, not as a column that stays empty."""
    from traces.schema import INPUT_FIELDS, TraceRecord

    assert set(TraceRecord.__struct_fields__) == INPUT_FIELDS - {"schema_version"}
