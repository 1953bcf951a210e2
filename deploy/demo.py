"""`flywheel demo`: turns of the loop on the local stack, each step timed.

baseline eval -> rollouts of the reverse-a-word environment through the gateway (rewards posted
to /v1/feedback) -> reward-filtered export (the best rollout per task, by SQL) -> LoRA
fine-tune on the engine's own token ids -> register the checkpoint -> hot-swap it behind the
alias -> eval again. This is rejection sampling (expert iteration): the training data is the
model's own served trajectories, selected by reward. The reward per turn goes to a PNG.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from deploy.config import StackConfig

console = Console()
FULL_LR = 3e-4  # every weight moves: a tenth of the LoRA's rate


@contextmanager
def step(title: str):
    console.rule(f"[bold]{title}")
    t0 = time.monotonic()
    yield
    console.print(f"[dim]{title}: {time.monotonic() - t0:.1f} s[/]")


def _wait_rows(store, where: str, n: int, timeout_s: float = 15.0) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        store.refresh()
        got = store.sql(f"SELECT count(*) AS n FROM traces WHERE {where}").column("n")[0].as_py()
        if got >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


def plot_rewards(history: list[float], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    ax.plot(range(len(history)), history, marker="o")
    ax.set_xticks(range(len(history)))
    ax.set_xlabel("loop turn (0 = base model)")
    ax.set_ylabel("mean eval reward (greedy)")
    ax.set_title("reverse-a-word: reward per turn")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _demo_key(cfg: StackConfig) -> str:
    """A key for team 'demo', created once per home, so the demo's traces are attributed."""
    from serve.keys import KeyStore
    from serve.secret_files import write_private

    path = cfg.run_dir / "demo.key"
    if not path.exists():
        _, key = KeyStore(cfg.resolved_gateway().keys_file).create("demo", "flywheel demo")
        write_private(path, key)
    return path.read_text().strip()


def run_demo(cfg: StackConfig, keep_up: bool = False, turns: int = 1, seed: int = 0,
             samples: int = 8, n_tasks: int = 16, full: bool = False) -> dict:
    """Run ``turns`` turns of the loop; returns the reward history and checkpoint versions
    (``ok`` is True when the final reward beats the baseline and every swap was served). With
    ``full``, each turn fine-tunes every weight and reloads them in place instead of a LoRA."""
    import datasets
    import transformers

    from deploy.cli import arrow_table
    from deploy.launcher import down, status, up
    from envs import reverse
    from envs.runner import mean_reward, post_rewards, run_rollouts
    from feedback.export import export
    from feedback.hotswap import HotSwap
    from feedback.registry import BASE, Registry
    from feedback.train import TrainConfig, train_full, train_lora
    from traces.store import TraceStore

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    t_start = time.monotonic()
    gw = cfg.resolved_gateway()
    url = f"http://{gw.host}:{gw.port}"
    alias = cfg.worker.served_model_name
    started_here = False
    with step("stack"):
        if all(r["healthy"] for r in status(cfg)):
            console.print(f"using the running stack at {url}/v1")
        else:
            timings = up(cfg)
            started_here = True
            console.print("started: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    key = _demo_key(cfg)
    store = TraceStore(cfg.traces_path)
    registry = Registry(cfg.home_path / "checkpoints.json")
    swap = HotSwap(url, gw.admin_key, registry, cfg.deployment_name, alias, cfg.model_path)
    kind = "full" if full else "lora"
    run_id = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + f"-s{seed}"
    tasks = reverse.tasks(n_tasks, seed)

    def evaluate(label: str) -> float:
        rollouts = run_rollouts(url, key, alias, tasks, 1, reverse.reward, f"reverse-eval-{run_id}",
                                temperature=0.0)
        post_rewards(url, key, rollouts, "reverse-eval")
        for r in rollouts[:3]:
            console.print(f"  {r.example_id}: {r.completion!r} -> reward {r.reward:.2f}")
        score = mean_reward(rollouts)
        console.print(f"[bold]{label}: mean reward {score:.3f}[/] over {len(rollouts)} tasks")
        return score

    history, versions, parent = [], [], BASE
    try:
        with step("0. start from the base model; baseline eval"):
            swap.reset(alias)
            history.append(evaluate("baseline"))
        for turn in range(1, turns + 1):
            env = f"reverse-rollouts-{run_id}-t{turn}"
            with step(f"{turn}.1 rollouts: {samples} samples x {len(tasks)} tasks, rewards posted"):
                rollouts = run_rollouts(url, key, alias, tasks, samples, reverse.reward, env,
                                        temperature=1.0, seed=seed * 1000 + turn)
                post_rewards(url, key, rollouts, env)
                console.print(f"rollout mean reward {mean_reward(rollouts):.3f}, "
                              f"best per task {sum(max(r.reward for r in rollouts if r.example_id == t.example_id) for t in tasks) / len(tasks):.3f}")
                _wait_rows(store, f"env_id = '{env}'", len(rollouts))
            with step(f"{turn}.2 reward-filtered export (best trajectory per task so far)"):
                # every trajectory this run has served (rollouts and evals of all turns so far)
                sql = (f"SELECT t.*, r.reward FROM traces t JOIN rewards r USING (trace_id) "
                       f"WHERE t.env_id LIKE 'reverse-%-{run_id}%' AND r.name = 'reward' AND r.reward > 0 "
                       f"QUALIFY row_number() OVER (PARTITION BY t.example_id "
                       f"ORDER BY r.reward DESC, t.trace_id) = 1")
                data_dir = cfg.home_path / "datasets" / f"{run_id}-t{turn}"
                manifest = export(store, "sft", data_dir, sql)
                console.print(f"{manifest['rows']} rows -> {data_dir} (sha256 {manifest['content_hash'][:12]})")
            with step(f"{turn}.3 fine-tune {'every weight' if full else 'a LoRA'} on the engine's token ids"):
                ds = datasets.load_from_disk(str(data_dir))
                version = f"rs-{run_id}-t{turn}"
                ckpt = cfg.home_path / "checkpoints" / version
                losses: list[float] = []
                init = registry.get(parent).path if parent != BASE else None
                if full:  # from the weights served now, so turns compound like the LoRA's do
                    train_full(init or cfg.model_path, list(ds), ckpt, TrainConfig(steps=60, lr=FULL_LR, seed=seed),
                               progress=lambda s, loss: losses.append(loss))
                else:
                    train_lora(cfg.model_path, list(ds), ckpt, TrainConfig(steps=60, seed=seed),
                               progress=lambda s, loss: losses.append(loss), init_adapter=init)
                console.print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps")
            with step(f"{turn}.4 register and hot-swap {version} ({'reloaded in place' if full else 'LoRA'})"):
                registry.register(version, kind, ckpt, str(cfg.model_path), parent=parent,
                                  dataset=manifest, metrics={"loss_last": losses[-1]})
                swap.deploy(alias, version)
                versions.append(version)
                parent = version
            with step(f"{turn}.5 eval on {version}"):
                history.append(evaluate(f"after turn {turn}"))
        with step("the traces say which checkpoint served each eval"):
            _wait_rows(store, f"env_id = 'reverse-eval-{run_id}'", len(tasks) * (turns + 1))
            console.print(arrow_table(store.sql(
                "SELECT t.checkpoint_version, count(*) AS traces, round(avg(r.reward), 3) AS mean_reward "
                "FROM traces t JOIN rewards r USING (trace_id) "
                f"WHERE t.env_id = 'reverse-eval-{run_id}' GROUP BY ALL ORDER BY min(t.time_received)")))
        plot = cfg.home_path / f"reward-{run_id}.png"
        plot_rewards(history, plot)
        ok = history[-1] > history[0]
        verdict = "[green]reward rose[/]" if ok else "[red]reward did not rise[/]"
        console.print(f"{verdict}: {' -> '.join(f'{h:.3f}' for h in history)}; plot {plot}; "
                      f"demo took {time.monotonic() - t_start:.0f} s")
        return {"ok": ok, "rewards": history, "versions": versions, "plot": str(plot)}
    finally:
        if started_here and not keep_up:
            down(cfg)
