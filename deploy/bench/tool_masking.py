"""Cost of grammar masking per generated token, next to the cost of a decode step.

    .venv/bin/flywheel up && .venv/bin/python -m deploy.bench.tool_masking [--requests 16]

1. Offline: xgrammar's per-token work (fill the next-token bitmask, apply it to the logits,
   accept the sampled token) for a tool-call grammar over the tiny model's vocabulary, timed
   token by token while walking a valid tool call.
2. Online, side by side: mean inter-token latency of streamed requests through the running
   stack with and without the tool-call grammar (same prompts, same lengths).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx


def offline_mask_cost(model_dir: str, tools: list[dict]) -> dict:
    import torch
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from serve.tools.definitions import parse_tools
    from serve.tools.grammar import grammar_for

    tok = AutoTokenizer.from_pretrained(model_dir)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    compiled = xgr.GrammarCompiler(info).compile_grammar(
        xgr.Grammar.from_ebnf(grammar_for(parse_tools({"tools": tools, "tool_choice": "required"})))
    )
    text = (
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
    )
    ids = tok.encode(text)
    fill, apply, accept = [], [], []
    for _ in range(20):
        matcher = xgr.GrammarMatcher(compiled)
        bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
        logits = torch.randn(1, info.vocab_size)
        for t in ids:
            t0 = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            t1 = time.perf_counter()
            xgr.apply_token_bitmask_inplace(logits, bitmask)
            t2 = time.perf_counter()
            assert matcher.accept_token(t)
            t3 = time.perf_counter()
            fill.append(t1 - t0)
            apply.append(t2 - t1)
            accept.append(t3 - t2)

    def us(xs: list[float]) -> float:
        return round(statistics.median(xs) * 1e6, 1)

    return {
        "vocab": info.vocab_size,
        "tokens_walked": len(ids),
        "fill_us": us(fill),
        "apply_us": us(apply),
        "accept_us": us(accept),
        "total_us_per_token": round(us(fill) + us(apply) + us(accept), 1),
    }


def mean_itl_ms(url: str, body: dict) -> tuple[float, int]:
    times = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                obj = json.loads(line[6:])
                if any((c.get("delta") or {}).get("content") for c in obj.get("choices", [])):
                    times.append(time.perf_counter())
    gaps = [b - a for a, b in zip(times, times[1:])]
    return (statistics.mean(gaps) * 1000 if gaps else float("nan")), len(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frontend", default="http://127.0.0.1:8100", help="the deployment (no gateway)")
    ap.add_argument("--model-dir", default=".flywheel/models/tiny")
    ap.add_argument("--requests", type=int, default=16)
    args = ap.parse_args()
    from serve.tools.definitions import parse_tools
    from serve.tools.grammar import grammar_for

    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 200},
                        "days": {"type": "integer", "minimum": 1, "maximum": 7},
                    },
                    "required": ["city", "days"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    result = {"offline_mask": offline_mask_cost(args.model_dir, tools)}
    grammar = grammar_for(parse_tools({"tools": tools, "tool_choice": "required"}))
    base = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "weather in Oslo?"}],
        "tools": tools,
        "max_tokens": 48,
        "temperature": 1.0,
    }
    runs = {"unconstrained": [], "constrained": []}
    for i in range(args.requests):  # interleaved, so machine noise hits both alike
        runs["unconstrained"].append(mean_itl_ms(args.frontend, {**base, "seed": i})[0])
        runs["constrained"].append(mean_itl_ms(args.frontend, {**base, "seed": i, "guided_grammar": grammar})[0])
    itl = {k: round(statistics.median(v), 3) for k, v in runs.items()}
    result["online_itl_ms"] = itl
    result["online_overhead_pct"] = round((itl["constrained"] / itl["unconstrained"] - 1) * 100, 1)
    result["offline_mask_pct_of_decode_step"] = round(
        result["offline_mask"]["total_us_per_token"] / (itl["unconstrained"] * 1000) * 100, 2
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
