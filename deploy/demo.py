"""`flywheel demo`: one turn of the loop on the local stack, each step timed.

serve (baseline eval + sampled rollouts through the gateway, OpenAI SDK) -> SQL over the traces
-> SFT export (datasets) -> LoRA fine-tune on the engine's own token ids -> hot-swap into the
running deployment -> eval again -> SQL shows the new checkpoint version. The swap is checked by
the outputs changing, not assumed.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone

from rich.console import Console

from deploy.config import StackConfig

console = Console()

WORDS = ["apple", "river", "planet", "silver", "garden", "window", "rocket", "forest",
         "candle", "bridge", "yellow", "marble", "tiger", "cloud", "pepper", "violin"]
EVAL_PROMPTS = [f"Reverse the word: {w}" for w in WORDS[:8]]
ROLLOUT_PROMPTS = [f"Reverse the word: {w}" for w in WORDS]


@contextmanager
def step(title: str):
    console.rule(f"[bold]{title}")
    t0 = time.monotonic()
    yield
    console.print(f"[dim]{title}: {time.monotonic() - t0:.1f} s[/]")


def _ask(client, model: str, prompt: str, env_id: str, temperature: float, seed: int) -> str:
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=16,
        temperature=temperature, seed=seed, extra_headers={"X-Env-ID": env_id})
    return r.choices[0].message.content or ""


def _eval(client, model: str, label: str) -> list[str]:
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda p: _ask(client, model, p, f"demo-eval-{label}", 0.0, 0),
                             EVAL_PROMPTS))


def _wait_rows(store, where: str, n: int, timeout_s: float = 15.0) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        store.refresh()
        got = store.sql(f"SELECT count(*) AS n FROM traces WHERE {where}").column("n")[0].as_py()
        if got >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


def run_demo(cfg: StackConfig, keep_up: bool = False, rollouts_per_prompt: int = 4) -> bool:
    from openai import OpenAI

    from deploy.cli import arrow_table
    from deploy.launcher import status, up
    from feedback.export import export_sft
    from feedback.hotswap import load_lora, point_alias
    from feedback.train import TrainConfig, train_lora
    from traces.store import TraceStore

    import datasets
    import transformers
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()

    t_start = time.monotonic()
    gw = cfg.resolved_gateway()
    gateway_url = f"http://{gw.host}:{gw.port}"
    alias = cfg.worker.served_model_name
    started_here = False
    with step("1. stack"):
        if all(r["healthy"] for r in status(cfg)):
            console.print(f"using the running stack at {gateway_url}/v1")
        else:
            timings = up(cfg)
            started_here = True
            console.print("started: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    client = OpenAI(base_url=f"{gateway_url}/v1", api_key="flywheel-local", max_retries=0)
    store = TraceStore(cfg.traces_path)
    run_id = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    try:
        with step("2. baseline eval (greedy, through the gateway)"):
            before = _eval(client, alias, "before")
            for p, out in zip(EVAL_PROMPTS[:3], before):
                console.print(f"  {p!r} -> {out!r}")
        with step(f"3. rollouts ({len(ROLLOUT_PROMPTS) * rollouts_per_prompt} sampled requests)"):
            jobs = [(p, s) for p in ROLLOUT_PROMPTS for s in range(rollouts_per_prompt)]
            env = f"demo-rollouts-{run_id}"
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda j: _ask(client, alias, j[0], env, 1.0, j[1]), jobs))
            where = f"env_id = '{env}'"
            rows = _wait_rows(store, where, len(jobs))
            console.print(f"{rows} rollout traces stored")
        with step("4. SQL over the trace store"):
            console.print(arrow_table(store.sql(
                "SELECT checkpoint_version, env_id, count(*) AS traces, "
                "round(avg(ttft_ms), 1) AS ttft_ms, sum(gen_ai_usage_output_tokens) AS out_tokens "
                "FROM traces GROUP BY ALL ORDER BY ALL")))
        with step("5. export SFT dataset"):
            data_dir = cfg.home_path / "datasets" / f"sft-{run_id}"
            manifest = export_sft(store, data_dir, f"SELECT * FROM traces WHERE {where} "
                                                   "AND http_status = 200 AND error IS NULL")
            console.print(f"{manifest['rows']} rows -> {data_dir} (sha256 {manifest['content_hash'][:12]})")
        with step("6. fine-tune a LoRA on the engine's token ids"):
            from datasets import load_from_disk
            ds = load_from_disk(str(data_dir))
            ckpt = cfg.home_path / "checkpoints" / f"sft-{run_id}"
            losses = []
            train_lora(cfg.model_path, list(ds), ckpt, TrainConfig(),
                       progress=lambda s, loss: losses.append(loss))
            console.print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps -> {ckpt}")
        with step("7. hot-swap into the running deployment"):
            version = f"sft-{run_id}"
            lora_name = f"{alias}-{version}"
            dep = gw.deployments[0]
            load_lora(dep.admin_urls, dep.url, lora_name, ckpt)
            point_alias(gateway_url, gw.admin_key, alias, dep.name, lora_name, version)
            console.print(f"alias {alias!r} -> {lora_name!r} (checkpoint {version})")
        with step("8. eval again"):
            after = _eval(client, alias, "after")
            changed = sum(a != b for a, b in zip(before, after))
            for p, a, b in list(zip(EVAL_PROMPTS, before, after))[:3]:
                console.print(f"  {p!r}: {a!r} -> {b!r}")
            console.print(f"{changed}/{len(EVAL_PROMPTS)} greedy outputs changed")
        with step("9. the new traces carry the new checkpoint"):
            _wait_rows(store, f"checkpoint_version = '{version}'", len(EVAL_PROMPTS))
            console.print(arrow_table(store.sql(
                "SELECT env_id, checkpoint_version, gen_ai_response_model, count(*) AS traces "
                f"FROM traces WHERE env_id LIKE 'demo-eval-%' AND time_received >= "
                f"(SELECT min(time_received) FROM traces WHERE env_id = '{env}') - INTERVAL 5 MINUTE "
                "GROUP BY ALL ORDER BY ALL")))
            swapped = _wait_rows(store, f"env_id = 'demo-eval-after' AND checkpoint_version = '{version}'",
                                 len(EVAL_PROMPTS))
        ok = changed > 0 and swapped >= len(EVAL_PROMPTS)
        verdict = "[green]loop closed[/]" if ok else "[red]hot-swap not verified[/]"
        console.print(f"{verdict}: demo took {time.monotonic() - t_start:.0f} s")
        return ok
    finally:
        if started_here and not keep_up:
            from deploy.launcher import down
            down(cfg)
