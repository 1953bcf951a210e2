"""What NVFP4 KV costs a model's outputs, measured: the model run with its KV cache quantised on
the fly (every key and value the attention reads went through the format: kernels/kv_formats.py)
against the same model with an fp32 cache, side by side for bf16, FP8 and NVFP4 (amax rule and
mse rule), per context length.

    .venv/bin/python -m deploy.bench.kv_accuracy [--model DIR] [--lengths 256,1024,2048]
        [--sequences 32] [--plot kv-accuracy.png] [--text FILE]

For each length L, ``--sequences`` windows of L tokens of text (``--text``, else Python's
standard library sources: present on every machine) are run once per format. Over the positions
in the window's second half (the long-context ones), it prints:
- ``agree``: how often the most likely next token is the fp32 cache's;
- ``kl``: the mean KL divergence of the next-token distribution from the fp32 cache's (nats);
- ``ppl``: the perplexity of the text's own next tokens;
and each format's relative error on the cache's keys and values. Then the mse rule against the
amax rule window by window: the mean difference of their KL with its 95 % interval, and in how
many windows the mse rule's is the lower (4 windows' means differed by less than their noise).
``--model`` is any Hugging Face causal LM whose head size is a multiple of 16 (default: the tiny
model, made here).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from deploy.models.tiny_model import stdlib_sources
from kernels.kv_formats import FORMATS, relative_error, round_trip


def quantised_cache(fmt: str, config, errors: list[float]):
    """A transformers DynamicCache whose every update is stored in ``fmt``; ``errors`` collects
    the relative error of each tensor it stored (keys and values)."""
    from transformers import DynamicCache

    class QuantisedCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            stored = [round_trip(x, fmt) for x in (key_states, value_states)]
            errors.extend(relative_error(x, y) for x, y in zip((key_states, value_states), stored))
            return super().update(*stored, layer_idx, *args, **kwargs)

    return QuantisedCache(config=config)


def text_tokens(tokenizer, text_file: str | None, need: int) -> torch.Tensor:
    """At least ``need`` tokens of text: the file's, or the standard library's sources."""
    if text_file:
        texts = [Path(text_file).read_text(encoding="utf-8", errors="ignore")]
    else:
        texts = stdlib_sources(max_bytes=need * 64)  # more bytes than tokens for any tokenizer here
    ids: list[int] = []
    for text in texts:
        ids += tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) >= need:
            return torch.tensor(ids[:need])
    raise SystemExit(f"the text has {len(ids)} tokens; {need} are needed (fewer --sequences or shorter --lengths)")


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, formats=FORMATS, batch: int = 4) -> dict[str, dict]:
    """``windows`` [n, L] token ids -> format -> {agree, kl, ppl, kv_rel_err, kl_windows} over the
    second half; ``kl_windows`` is each window's own mean KL, for comparing two formats window by
    window. The windows run ``batch`` at a time (one batch of 48 long windows would not fit)."""
    L = windows.shape[1]
    half = slice(L // 2, L - 1)  # positions whose next token is in the window
    per: dict[str, dict[str, list]] = {fmt: {"agree": [], "kl": [], "nll": [], "errors": []} for fmt in formats}
    for chunk in windows.split(batch):
        targets, logp_ref = chunk[:, L // 2 + 1 :], None
        for fmt in formats:
            logits = model(chunk, past_key_values=quantised_cache(fmt, model.config, per[fmt]["errors"]), use_cache=True).logits
            logp = torch.log_softmax(logits[:, half].float(), dim=-1)
            if logp_ref is None:
                if fmt != "fp32":
                    raise ValueError("the first format is the reference: fp32")
                logp_ref = logp
            per[fmt]["agree"].append((logp.argmax(-1) == logp_ref.argmax(-1)).float())
            per[fmt]["kl"].append((logp_ref.exp() * (logp_ref - logp)).sum(-1))
            per[fmt]["nll"].append(-logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1))
    out = {}
    for fmt, r in per.items():
        kl = torch.cat(r["kl"])
        out[fmt] = {
            "agree": torch.cat(r["agree"]).mean().item(),
            "kl": kl.mean().item(),
            "ppl": torch.cat(r["nll"]).mean().exp().item(),
            "kv_rel_err": sum(r["errors"]) / len(r["errors"]),
            "kl_windows": kl.mean(-1).tolist(),
        }
    return out


def paired(base: list[float], other: list[float]) -> dict[str, float]:
    """``other`` against ``base`` on the same windows: the mean difference, the half-width of its
    95 % interval (normal approximation; NaN under 2 windows), and in how many windows it is lower."""
    d = torch.tensor(other) - torch.tensor(base)
    half_width = 1.96 * d.std().item() / len(d) ** 0.5 if len(d) > 1 else float("nan")
    return {"difference": d.mean().item(), "within": half_width, "lower": int((d < 0).sum()), "windows": len(d)}


def table(results: dict[int, dict[str, dict]]) -> str:
    lines = [f"{'length':>7} {'format':<10} {'agree':>7} {'kl (nats)':>11} {'ppl':>9} {'kv rel err':>10}"]
    for L, by_fmt in results.items():
        for fmt, r in by_fmt.items():
            lines.append(f"{L:>7} {fmt:<10} {r['agree']:>7.4f} {r['kl']:>11.2e} {r['ppl']:>9.2f} {r['kv_rel_err']:>10.4f}")
    return "\n".join(lines)


def comparison(results: dict[int, dict[str, dict]], base: str = "nvfp4", other: str = "nvfp4-mse") -> str:
    """``other``'s KL against ``base``'s, window by window: what a few windows' means cannot say."""
    lines = [
        f"{other} against {base}, KL window by window:",
        f"{'length':>7} {'kl ' + base:>12} {'kl ' + other:>14} {'difference (95 %)':>22} {'lower in':>12}",
    ]
    for L, by_fmt in results.items():
        p = paired(by_fmt[base]["kl_windows"], by_fmt[other]["kl_windows"])
        diff = f"{p['difference']:+.2e} +- {p['within']:.1e}"
        lines.append(
            f"{L:>7} {by_fmt[base]['kl']:>12.2e} {by_fmt[other]['kl']:>14.2e} {diff:>22} {p['lower']:>4}/{p['windows']} windows"
        )
    return "\n".join(lines)


def plot(results: dict[int, dict[str, dict]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = list(results)
    fig, (ax_kl, ax_agree) = plt.subplots(1, 2, figsize=(10, 4))
    for fmt in next(iter(results.values())):
        if fmt == "fp32":
            continue
        ax_kl.plot(lengths, [results[L][fmt]["kl"] for L in lengths], marker="o", label=fmt)
        ax_agree.plot(lengths, [results[L][fmt]["agree"] for L in lengths], marker="o", label=fmt)
    ax_kl.set(xscale="log", yscale="log", xlabel="context length (tokens)", ylabel="KL from fp32 cache (nats)")
    ax_agree.set(xscale="log", xlabel="context length (tokens)", ylabel="next-token agreement with fp32 cache")
    ax_kl.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run(model_dir: Path, lengths: list[int], sequences: int, text_file: str | None = None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    most = getattr(model.config, "max_position_embeddings", None)
    if most and max(lengths) > most:
        raise SystemExit(f"--lengths goes past the model's {most} positions")
    tokens = text_tokens(AutoTokenizer.from_pretrained(model_dir), text_file, max(lengths) * sequences)
    results = {}
    for L in lengths:
        windows = torch.stack([tokens[i * L : (i + 1) * L] for i in range(sequences)])
        results[L] = evaluate(model, windows)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="a Hugging Face causal LM directory (default: the tiny model, made here)")
    ap.add_argument("--lengths", default="256,1024,2048", help="context lengths, comma-separated")
    ap.add_argument("--sequences", type=int, default=32, help="windows of text per length")
    ap.add_argument("--text", help="a text file to evaluate on (default: Python's standard library sources)")
    ap.add_argument("--plot", type=Path, help="write KL and agreement against length to this PNG")
    args = ap.parse_args()
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        raise SystemExit(f"--lengths takes integers separated by commas, not {args.lengths!r}") from None
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            from deploy.models.tiny_model import make_tiny_model

            model_dir = make_tiny_model(Path(tmp) / "tiny", seed=0)
        results = run(model_dir, lengths, args.sequences, args.text)
    print(f"model: {args.model or 'tiny (made here)'}; {args.sequences} windows per length; {time.monotonic() - t0:.0f} s")
    print(table(results))
    print(comparison(results))
    if args.plot:
        plot(results, args.plot, f"KV formats vs an fp32 cache: {args.model.name if args.model else 'tiny'}")
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
