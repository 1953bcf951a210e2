"""`flywheel loop`: the feedback loop on any verifiers taskset, turn after turn, resumable.

Per turn: rollouts of the taskset's first ``train_tasks`` tasks through the gateway (rewards from
the environment's own reward functions, posted to ``/v1/feedback``) -> an export by SQL (``rl``
rows with the engine's logprobs for GRPO, or ``sft`` rows of exact solves for rejection
sampling) -> training a LoRA on the warmed base -> register (lineage: dataset manifest, parent,
env, turn) -> hot-swap -> a greedy eval on the ``eval_tasks`` held back after them.

Every phase's result is written to ``<home>/loops/<run>/state.json`` when it completes; the
checkpoints, datasets and rewards are durable already, so ``--resume RUN`` carries on from the
last completed phase (a phase cut short runs again, its partial rollouts under another env id).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from deploy.stack.config import StackConfig
from deploy.loop_report import Reporter
from deploy.loop_state import LoopConfig, LoopState

PHASES = ("rollouts", "export", "train", "deploy", "eval")


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def run_scope(team: str, key_id: str | None) -> str:
    """The loop's rows only: ``env_id`` is a client header anyone can send with a guessed run
    id, so what trains the checkpoint is also the team and the key that ran the loop (another
    team's traces and rewards once entered the demo's training data this way)."""
    key = f"t.api_key_id = {_quote(key_id)}" if key_id else "t.api_key_id IS NULL"
    return f"t.team = {_quote(team)} AND {key}"


def training_sql(algo: str, scope: str, env_id: str, run_id: str, solve_at: float) -> tuple[str, str]:
    """(export kind, SQL) for one turn's training data: this turn's groups for GRPO, the first
    exact solve per task among the run's rollouts for rejection sampling."""
    base = ("SELECT t.*, r.reward FROM traces t JOIN rewards r USING (trace_id) "
            f"WHERE r.name = 'reward' AND t.http_status = 200 AND {scope} AND ")
    if algo == "grpo":  # this turn's groups, as sampled by the policy being updated
        return "rl", base + f"t.env_id = {_quote(env_id)}"
    return "sft", (base + f"t.env_id LIKE {_quote(run_id + '-t%')} AND r.reward >= {float(solve_at)} "
                   "QUALIFY row_number() OVER (PARTITION BY t.example_id ORDER BY t.trace_id) = 1")


def _wait_rewarded(store, scope: str, env_id: str, n: int, timeout_s: float = 30.0) -> int:
    """Wait until ``n`` of the env's trace rows carry a reward (they reach Parquet in batches)."""
    deadline = time.monotonic() + timeout_s
    while True:
        store.refresh()
        got = store.sql("SELECT count(*) AS n FROM traces t JOIN rewards r USING (trace_id) "
                        f"WHERE t.env_id = $1 AND {scope} AND r.name = 'reward'", params=[env_id]).column("n")[0].as_py()
        if got >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


def _tokens(store, scope: str, env_ids: list[str]) -> int:
    row = store.sql("SELECT coalesce(sum(gen_ai_usage_input_tokens + gen_ai_usage_output_tokens), 0) AS n "
                    f"FROM traces t WHERE list_contains($1, env_id) AND {scope}", params=[env_ids])
    return int(row.column("n")[0].as_py())


def _summary(results, solve_at: float) -> dict:
    n = max(len(results), 1)
    return {"n": len(results), "reward_mean": round(sum(r.reward for r in results) / n, 4),
            "exact_solve": round(sum(r.reward >= solve_at for r in results) / n, 4)}


class Loop:
    def __init__(self, cfg: StackConfig, state: LoopState, key: str, report: Reporter):
        import datasets
        import transformers

        from feedback.hotswap import HotSwap
        from feedback.registry import Registry
        from serve.keys import KeyStore
        from traces.store import TraceStore

        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()

        self.cfg, self.state, self.lc, self.key, self.report = cfg, state, state.config, key, report
        gw = cfg.resolved_gateway()
        self.url = gw.url
        self.alias = cfg.worker.served_model_name
        self.store = TraceStore(cfg.traces_path)
        owner = KeyStore(gw.keys_file).lookup(key) if gw.keys_file else None
        if owner is None or owner.revoked:
            raise ValueError("the loop's key is not a live team key of this stack")
        self.team, self.scope = owner.team, run_scope(owner.team, owner.id)
        self.registry = Registry(gw.checkpoints_file)
        self.swap = HotSwap(self.url, gw.admin_key, self.registry, cfg.deployment_name, self.alias, cfg.model_path)

    def _phase(self, name: str, fn) -> dict:
        """Run ``fn`` unless the state already has its result; record the result with its time."""
        done = self.state.done(name)
        if done is not None:
            return done
        t0 = time.monotonic()
        with self.report.phase(name):
            result = fn()
        result["seconds"] = round(time.monotonic() - t0, 1)
        self.state.record(name, result)
        return result

    def _episodes(self, env_id: str, offset: int, n: int, samples: int, temperature: float):
        from envs.vf_run import run_env

        return run_env(self.lc.env, self.url, self.key, self.alias, n=n, rollouts=samples,
                       max_tokens=self.lc.max_tokens, temperature=temperature, env_id=env_id,
                       offset=offset, taskset_args=self.lc.env_args)

    def _eval(self, turn: int) -> dict:
        env_id = f"{self.state.run_id}-eval-t{turn}"
        results = self._episodes(env_id, self.lc.train_tasks, self.lc.eval_tasks, 1, 0.0)
        out = {**_summary(results, self.lc.solve_at), "env_id": env_id,
               "examples": [[r.example_id, r.reply, r.reward] for r in results[:3]]}
        rewarded = _wait_rewarded(self.store, self.scope, env_id, len(results))
        out["tokens"] = _tokens(self.store, self.scope, [env_id]) if rewarded else 0
        return out

    def _rollouts(self, turn: int) -> dict:
        attempt = sum(1 for k in self.state.data.get("attempts", []) if k == turn)
        self.state.data.setdefault("attempts", []).append(turn)  # a rerun after a crash gets a new env id
        self.state.save()
        env_id = f"{self.state.run_id}-t{turn}-a{attempt}"
        lc = self.lc
        results = self._episodes(env_id, 0, lc.train_tasks, lc.samples, 1.0)
        rewarded = _wait_rewarded(self.store, self.scope, env_id, len(results))
        return {**_summary(results, lc.solve_at), "env_id": env_id, "rewarded": rewarded,
                "tokens": _tokens(self.store, self.scope, [env_id])}

    def _export(self, turn: int, rollouts: dict) -> dict:
        from feedback.export import export

        lc = self.lc
        out = self.cfg.home_path / "datasets" / f"{self.state.run_id}-t{turn}"
        kind, sql = training_sql(lc.algo, self.scope, rollouts["env_id"], self.state.run_id, lc.solve_at)
        try:
            return export(self.store, kind, out, sql)
        except ValueError as exc:  # nothing solved yet: this turn trains nothing
            return {"kind": kind, "sql": sql, "rows": 0, "note": str(exc)}

    def _train(self, turn: int, parent: str, warm: Path, manifest: dict) -> dict:
        import datasets

        from feedback.grpo import GRPOConfig, train_grpo
        from feedback.train import TrainConfig, train_full, train_lora

        lc = self.lc
        version = f"{lc.algo}-{self.state.run_id}-t{turn}"
        ckpt = self.cfg.home_path / "checkpoints" / version
        if not manifest["rows"]:
            return self._unchanged(parent, manifest["note"])
        rows = list(datasets.load_from_disk(str(self.cfg.home_path / "datasets" / f"{self.state.run_id}-t{turn}")))
        init = self.registry.get(parent).path if parent != self.state.data["base_version"] else None
        seed = lc.seed * 1000 + turn
        if lc.algo == "grpo":
            try:
                metrics = train_grpo(warm, rows, ckpt, GRPOConfig(steps=lc.steps, seed=seed), init_adapter=init)
            except ValueError as exc:  # every group scored alike: no gradient this turn
                return self._unchanged(parent, str(exc))
        else:
            losses: list[float] = []
            if lc.full:
                train_full(init or warm, rows, ckpt, TrainConfig(steps=lc.steps, lr=3e-4, seed=seed),
                           progress=lambda s, loss: losses.append(loss))
            else:
                train_lora(warm, rows, ckpt, TrainConfig(steps=lc.steps, seed=seed),
                           progress=lambda s, loss: losses.append(loss), init_adapter=init)
            metrics = {"algo": "rs", "rows": len(rows), "loss_first": losses[0], "loss_last": losses[-1]}
        return {"version": version, "path": str(ckpt), "metrics": metrics,
                "kind": "full" if lc.full else "lora", "dataset": manifest}

    def _unchanged(self, parent: str, why: str) -> dict:
        self.report.console.print(f"[yellow]nothing to train on this turn ({why}); {parent} stays[/]")
        return {"version": parent, "path": None, "metrics": {"algo": self.lc.algo, "skipped": why}}

    def _deploy(self, turn: int, parent: str, trained: dict) -> dict:
        from feedback.registry import RegistryError

        if trained["path"] is None:
            return {"version": parent}
        try:
            self.registry.register(trained["version"], trained["kind"], trained["path"],
                                   self.state.data["warm_path"], parent=parent, dataset=trained["dataset"],
                                   metrics=trained["metrics"], env=self.lc.env, turn=turn, team=self.team)
        except RegistryError:
            if self.registry.get(trained["version"]).path != str(Path(trained["path"]).resolve()):
                raise  # a resumed deploy finds its own registration; anything else is a clash
        self.swap.deploy(self.alias, trained["version"])
        return {"version": trained["version"]}

    def _base(self) -> tuple[Path, str]:
        """The warmed base checkpoint (built once per recipe), registered as a full checkpoint."""
        from deploy.models.warm_model import WarmupRecipe, warm_up
        from feedback.registry import BASE

        recipe = WarmupRecipe()
        warm = self.cfg.home_path / "models" / f"tiny-warm-{recipe.key()[:8]}"
        with self.report.phase("base: the tiny model's warm-up (once per recipe)"):
            warm_up(self.cfg.model_path, warm, recipe, progress=self.report.progress("warm-up"))
        version = f"warm-{recipe.key()[:8]}"
        if version not in {c.version for c in self.registry.list()}:
            self.registry.register(version, "full", warm, str(self.cfg.model_path), parent=BASE,
                                   metrics=json.loads((warm / "warmup.json").read_text()))
        return warm, version

    def run(self) -> list[dict]:
        lc, state = self.lc, self.state
        warm, base_version = self._base()
        state.data.update(warm_path=str(warm), base_version=base_version)
        current = base_version
        for turn in range(1, lc.turns + 1):  # a resume serves what the last completed deploy did
            deployed = state.done(f"{turn}.deploy")
            current = deployed["version"] if deployed else current
        self.swap.deploy(self.alias, base_version)  # the warmed weights, reloaded in place
        if current != base_version:
            self.swap.deploy(self.alias, current)
        turns = [{"turn": 0, "version": base_version, "eval": self._phase("0.eval", lambda: self._eval(0))}]
        self.report.turn(turns[-1])
        parent = base_version
        for t in range(1, lc.turns + 1):
            roll = self._phase(f"{t}.rollouts", lambda: self._rollouts(t))
            manifest = self._phase(f"{t}.export", lambda: self._export(t, roll))
            trained = self._phase(f"{t}.train", lambda: self._train(t, parent, warm, manifest))
            self._phase(f"{t}.deploy", lambda: self._deploy(t, parent, trained))
            ev = self._phase(f"{t}.eval", lambda: self._eval(t))
            parent = trained["version"]
            seconds = {p: state.done(f"{t}.{p}")["seconds"] for p in PHASES}
            turns.append({"turn": t, "version": parent, "eval": ev, "rollouts": roll,
                          "train": trained["metrics"], "seconds": seconds})
            self.report.turn(turns[-1])
        return turns


def _gateway_url(cfg: StackConfig) -> str:
    return cfg.resolved_gateway().url


def team_key(cfg: StackConfig, team: str = "demo") -> str:
    """A key for ``team``, created once per home, so the loop's traces are attributed."""
    from serve.keys import KeyStore
    from serve.secret_files import write_private

    path = cfg.run_dir / f"{team}.key"
    if not path.exists():
        _, key = KeyStore(cfg.resolved_gateway().keys_file).create(team, f"flywheel {team}")
        write_private(path, key)
    return path.read_text().strip()


def run_loop(cfg: StackConfig, lc: LoopConfig | None = None, resume: str | None = None,
             keep_up: bool = False, as_json: bool = False) -> dict:
    """Run (or resume) a loop; returns the per-turn record (also in the run's state.json)."""
    from deploy.stack.launcher import down, status, up

    from envs.vf_run import flat_alias

    state = LoopState.open(cfg.home_path, resume, lc) if resume else None
    flat_alias((state.config if state else lc).env)  # a taskset that does not import fails here, first
    report = Reporter(quiet=as_json)
    t0 = time.monotonic()
    started_here = False
    with report.phase("stack"):
        if not all(r["healthy"] for r in status(cfg)):
            up(cfg)
            started_here = True
    try:
        state = state or LoopState.open(cfg.home_path, None, lc)
        turns = Loop(cfg, state, team_key(cfg), report).run()
        plot = cfg.home_path / f"loop-{state.run_id}.png"
        report.plot(turns, plot, state.config)
        result = {"run_id": state.run_id, "env": state.config.env, "algo": state.config.algo,
                  "turns": turns, "plot": str(plot), "wall_s": round(time.monotonic() - t0, 1),
                  "improved": turns[-1]["eval"]["exact_solve"] > turns[0]["eval"]["exact_solve"]
                  or turns[-1]["eval"]["reward_mean"] > turns[0]["eval"]["reward_mean"],
                  "ui": {"url": f"{_gateway_url(cfg)}/ui/checkpoints", "key_file": str(cfg.run_dir / "demo.key"),
                         "stack_stays_up": keep_up or not started_here}}
        state.data["result"] = result
        state.save()
        report.final(result)
        return result
    finally:
        if started_here and not keep_up:
            down(cfg)
