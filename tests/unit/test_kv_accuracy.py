"""The NVFP4 KV evaluation (deploy/bench/kv_accuracy.py) in its small configuration, on the tiny
model: the cache it builds really stores each format (each format's error on the keys and values
is that format's), the figures order as the formats' precision does, the two NVFP4 rules are
compared window by window, and a user's mistake on its command line gets one line."""

import subprocess
import sys

import pytest
import torch

from deploy.bench.kv_accuracy import comparison, evaluate, paired, table, text_tokens


def test_each_format_costs_the_outputs_in_the_order_of_its_precision(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    tokens = text_tokens(AutoTokenizer.from_pretrained(tiny_model_dir), None, 2 * 256)
    r = evaluate(model, tokens.reshape(2, 256))
    print("\n" + table({256: r}) + "\n" + comparison({256: r}))
    assert r["fp32"]["kv_rel_err"] == 0 and r["fp32"]["kl"] == pytest.approx(0, abs=1e-9)
    # the cache stored each format: its keys' and values' error is the format's own
    assert r["bf16"]["kv_rel_err"] < 0.005 < r["fp8"]["kv_rel_err"] < 0.04 < r["nvfp4"]["kv_rel_err"] < 0.12
    assert r["nvfp4-mse"]["kv_rel_err"] < r["nvfp4"]["kv_rel_err"]
    assert 0 < r["bf16"]["kl"] < r["fp8"]["kl"] < r["nvfp4"]["kl"]
    assert r["bf16"]["agree"] >= r["nvfp4"]["agree"]
    assert all(v["ppl"] > 1 for v in r.values())
    # the rules are compared window by window: each window's own KL, whose mean is the table's
    for fmt in ("nvfp4", "nvfp4-mse"):
        assert len(r[fmt]["kl_windows"]) == 2 and sum(r[fmt]["kl_windows"]) / 2 == pytest.approx(r[fmt]["kl"], rel=1e-5)
    assert "256" in comparison({256: r}).splitlines()[-1] and "/2 windows" in comparison({256: r})
    p = paired([1.0, 2.0, 3.0], [0.5, 2.5, 2.0])
    assert p["lower"] == 2 and p["windows"] == 3 and p["difference"] == pytest.approx(-1 / 3) and p["within"] > 0


def test_a_mistake_on_the_command_line_gets_one_line():
    for args, says in ((["--lengths", "1k"], "--lengths takes integers"), (["--lengths", "4096"], "past the model's 2048")):
        out = subprocess.run(
            [sys.executable, "-m", "deploy.bench.kv_accuracy", *args], capture_output=True, text=True, timeout=120
        )
        assert out.returncode != 0 and says in out.stderr and "Traceback" not in out.stderr, out.stderr[-500:]
