"""The loop's phases on any verifiers taskset, turn after turn, resumable.

Per turn: rollouts of the taskset's first ``train_tasks`` tasks through the gateway (rewards from
the environment's own reward functions, posted to ``/v1/feedback``) -> an export by SQL (``rl``
rows with the engine's logprobs for GRPO, or ``sft`` rows of exact solves for rejection
sampling; ``loop.algorithms``) -> training on the warmed base -> register (lineage: dataset manifest, parent,
env, turn) -> hot-swap -> a greedy eval on the ``eval_tasks`` held back after them.

Every phase's result is written to ``<home>/loops/<run>/state.json`` when it completes; the
checkpoints, datasets and rewards are durable already, so ``--resume RUN`` carries on from the
last completed phase (a phase cut short runs again, its partial rollouts under another env id).
The loop is handed a ``LoopTarget``; starting the stack is the CLI's business.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

from loop.algorithms import NothingToLearn, algorithm_for
from loop.report import Reporter
from loop.scope import run_scope
from loop.state import LoopState
from loop.target import LoopTarget

PHASES = ("rollouts", "export", "train", "deploy", "eval")
SNAPSHOT_TRIES = 10  # fresh snapshots a team read takes when housekeeping removed a file under one


def _wait_rewarded(store, scope: str, env_id: str, n: int, timeout_s: float = 30.0) -> int:
    """Wait until ``n`` of the env's trace rows carry a reward (they reach Parquet in batches)."""
    deadline = time.monotonic() + timeout_s
    while True:
        store.refresh()
        got = (
            store.sql(
                "SELECT count(*) AS n FROM traces t JOIN rewards r USING (trace_id) "
                f"WHERE t.env_id = $1 AND {scope} AND r.name = 'reward'",
                params=[env_id],
            )
            .column("n")[0]
            .as_py()
        )
        if got >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


def _tokens(store, scope: str, env_ids: list[str]) -> int:
    row = store.sql(
        "SELECT coalesce(sum(gen_ai_usage_input_tokens + gen_ai_usage_output_tokens), 0) AS n "
        f"FROM traces t WHERE list_contains($1, env_id) AND {scope}",
        params=[env_ids],
    )
    return int(row.column("n")[0].as_py())


def _error_code(r: httpx.Response) -> str | None:
    try:
        return r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def _summary(results, solve_at: float) -> dict:
    n = max(len(results), 1)
    return {
        "n": len(results),
        "reward_mean": round(sum(r.reward for r in results) / n, 4),
        "exact_solve": round(sum(r.reward >= solve_at for r in results) / n, 4),
    }


class Loop:
    def __init__(self, target: LoopTarget, state: LoopState, report: Reporter):
        import datasets
        import transformers

        from feedback.hotswap import HotSwap
        from feedback.registry import Registry
        from traces.store import TraceStore

        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()

        self.target, self.state, self.lc, self.report = target, state, state.config, report
        self.algo = algorithm_for(self.lc)
        self.url, self.key, self.alias, self.home = target.gateway_url, target.key, target.alias, target.home
        self.store = TraceStore(target.traces)
        self.team, self.scope = target.team, run_scope(target.team, target.key_id)
        self.registry = Registry(target.registry)
        self.swap = HotSwap(self.url, target.admin_key, self.registry, target.deployment, self.alias, target.base_model)

    @property
    def model(self) -> str:
        """What the loop's rollouts and evals ask for: the alias, or the dedicated deployment of
        the last checkpoint released that way."""
        return self.state.data.get("dedicated", {}).get("served_model", self.alias)

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

        return run_env(
            self.lc.env,
            self.url,
            self.key,
            self.model,
            n=n,
            rollouts=samples,
            max_tokens=self.lc.max_tokens,
            temperature=temperature,
            env_id=env_id,
            offset=offset,
            taskset_args=self.lc.env_args,
        )

    def _eval(self, turn: int) -> dict:
        env_id = f"{self.state.run_id}-eval-t{turn}"
        results = self._episodes(env_id, self.lc.train_tasks, self.lc.eval_tasks, 1, 0.0)
        out = {
            **_summary(results, self.lc.solve_at),
            "env_id": env_id,
            "examples": [[r.example_id, r.reply, r.reward] for r in results[:3]],
        }
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
        return {
            **_summary(results, lc.solve_at),
            "env_id": env_id,
            "rewarded": rewarded,
            "tokens": _tokens(self.store, self.scope, [env_id]),
        }

    def _as_team(self, read):
        """``read(store)`` on a fresh sandbox of the team's (the store as ``POST /v1/traces/query``
        sees it); again on a newer one if housekeeping removed a file of the first."""
        from traces.store import SnapshotGone, TraceStore

        # feedback posted fast is compacted every 32 posts, each merge removing its inputs at once:
        # CI saw three snapshots in a row lose a file under a query (keeping them a while, as the
        # trace compactor does, is the fix still to make)
        for attempt in range(SNAPSHOT_TRIES):
            try:
                return read(TraceStore(self.target.traces, team=self.team))
            except SnapshotGone:
                if attempt == SNAPSHOT_TRIES - 1:
                    raise

    def _production(self, turn: int, serving: str) -> dict:
        """Wait for ``min_rows`` rewarded rows of the team's query served by ``serving`` since the
        last turn; the window they arrived in is this turn's."""
        from loop.production import production_rows

        previous = self.state.done(f"{turn - 1}.rollouts") if turn > 1 else None
        since = previous["until"] if previous else self.state.data["started"]
        deadline, shown = time.monotonic() + self.lc.wait_rows_s, 0.0
        while True:
            until = datetime.now(timezone.utc).isoformat()
            sql = production_rows(self.lc.from_traces, serving, since, until)
            count = f"SELECT count(*) AS n, avg(reward) AS mean FROM ({sql})"
            found = self._as_team(lambda store: store.sql(count).to_pylist()[0])
            if found["n"] >= self.lc.min_rows:
                break
            if time.monotonic() - shown > 15:
                self.report.console.print(f"  {found['n']}/{self.lc.min_rows} rewarded production rows served by {serving}")
                shown = time.monotonic()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"turn {turn}: {found['n']} of {self.lc.min_rows} rewarded production rows served by "
                    f"{serving} after {self.lc.wait_rows_s:.0f} s; is traffic reaching {self.alias!r}?"
                )
            time.sleep(2.0)
        return {
            "source": "production",
            "n": found["n"],
            "rewarded": found["n"],
            "reward_mean": round(found["mean"], 4),
            "served_by": serving,
            "since": since,
            "until": until,
            "tokens": 0,
        }

    def _export(self, turn: int, rollouts: dict) -> dict:
        from feedback.export import export

        out = self.home / "datasets" / f"{self.state.run_id}-t{turn}"
        kind = self.algo.export_kind
        production = rollouts.get("source") == "production"
        if production:
            from loop.production import production_rows

            rows = production_rows(self.lc.from_traces, rollouts["served_by"], rollouts["since"], rollouts["until"])
            sql = self.algo.from_rows(rows)
        else:
            sql = self.algo.training_sql(self.scope, rollouts["env_id"], self.state.run_id)
        try:
            if production:  # in the team's sandbox: its query can name no other team's rows
                return self._as_team(lambda store: export(store, kind, out, sql))
            return export(self.store, kind, out, sql)
        except ValueError as exc:  # nothing solved yet: this turn trains nothing
            return {"kind": kind, "sql": sql, "rows": 0, "note": str(exc)}

    def _train(self, turn: int, parent: str, warm: Path, manifest: dict) -> dict:
        import datasets

        version = f"{self.lc.algo}-{self.state.run_id}-t{turn}"
        ckpt = self.home / "checkpoints" / version
        if not manifest["rows"]:
            return self._unchanged(parent, manifest["note"])
        rows = list(datasets.load_from_disk(str(self.home / "datasets" / f"{self.state.run_id}-t{turn}")))
        init = self.registry.get(parent).path if parent != self.state.data["base_version"] else None
        try:
            metrics = self.algo.train(warm, rows, ckpt, self.lc.seed * 1000 + turn, init)
        except NothingToLearn as exc:
            return self._unchanged(parent, str(exc))
        return {"version": version, "path": str(ckpt), "metrics": metrics, "kind": self.algo.checkpoint_kind, "dataset": manifest}

    def _unchanged(self, parent: str, why: str) -> dict:
        self.report.console.print(f"[yellow]nothing to train on this turn ({why}); {parent} stays[/]")
        return {"version": parent, "path": None, "metrics": {"algo": self.lc.algo, "skipped": why}}

    def _deploy(self, turn: int, parent: str, trained: dict) -> dict:
        from feedback.registry import RegistryError

        if trained["path"] is None:
            return {"version": parent}
        try:
            self.registry.register(
                trained["version"],
                trained["kind"],
                trained["path"],
                self.state.data["warm_path"],
                parent=parent,
                dataset=trained["dataset"],
                metrics=trained["metrics"],
                env=self.lc.env,
                turn=turn,
                team=self.team,
            )
        except RegistryError:
            if self.registry.get(trained["version"]).path != str(Path(trained["path"]).resolve()):
                raise  # a resumed deploy finds its own registration; anything else is a clash
        if self.lc.release == "canary":
            return self._canary(parent, trained["version"])
        if self.lc.release == "dedicated":
            return self._dedicated(turn, trained["version"])
        self.swap.deploy(self.alias, trained["version"])
        return {"version": trained["version"]}

    def _admin(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.target.admin_key}"}
        return httpx.request(method, f"{self.url}{path}", json=body, headers=headers, timeout=60)

    def _dedicated(self, turn: int, version: str) -> dict:
        """Release ``version`` on a deployment of its own for the loop's team (the alias stays
        where it is); the loop's later rollouts and evals go to it, and the one the previous turn
        released is deleted once this one runs, or first, when the pool has no room for both."""
        name = f"{self.state.run_id}-t{turn}"
        previous = self.state.data.get("dedicated")
        found = self._admin("GET", "/v1/deployments").json()["data"]
        dep = next((d for d in found if d["name"] == name and d["team"] == self.team), None)  # a resumed release
        body = {"model": version, "name": name, "team": self.team, "replicas": 1}
        if dep is None:
            r = self._admin("POST", "/v1/deployments", body)
            if r.status_code != 202 and previous and _error_code(r) == "insufficient_capacity":
                self._delete(previous["id"])
                r = self._admin("POST", "/v1/deployments", body)
            if r.status_code != 202:
                raise RuntimeError(f"dedicated deployment of {version}: HTTP {r.status_code} {r.text[:300]}")
            dep = r.json()
        deadline = time.monotonic() + 900
        while dep["status"] != "RUNNING":
            if dep["status"] in ("FAILED", "STOPPED") or time.monotonic() > deadline:
                raise RuntimeError(f"dedicated deployment {dep['id']} of {version}: {dep['status']} {dep.get('reason') or ''}")
            time.sleep(1.0)
            dep = self._admin("GET", f"/v1/deployments/{dep['id']}").json()
        self.state.data["dedicated"] = {"id": dep["id"], "served_model": dep["served_model"]}
        self.state.save()
        if previous and previous["id"] != dep["id"]:
            self._delete(previous["id"])
        return {"version": version, "deployment": dep["id"], "served_model": dep["served_model"]}

    def _delete(self, deployment: str) -> None:
        """Delete a dedicated deployment and wait until its slots are free (404)."""
        self._admin("DELETE", f"/v1/deployments/{deployment}")
        deadline = time.monotonic() + 300
        while self._admin("GET", f"/v1/deployments/{deployment}").status_code != 404:
            if time.monotonic() > deadline:
                raise RuntimeError(f"dedicated deployment {deployment} was not gone 300 s after its delete")
            time.sleep(0.5)

    def _controller(self):
        from feedback.canary import CanaryController

        return CanaryController(self.swap, self.registry, self.store)

    def _canary(self, parent: str, version: str) -> dict:
        """Release ``version`` as a canary and wait for its decision (a resumed run picks up the
        canary it started, or the decision made meanwhile); the version serving afterwards."""
        decided = self.registry.get(version).canary
        if decided is None:
            controller = self._controller()
            if self.registry.canaries().get(self.alias, {}).get("candidate") != version:
                controller.start(self.alias, version, self.lc.canary.model_copy(update={"team": self.team}))
            decision = controller.watch(self.alias, on_look=self.report.canary)
            decided = {"action": decision.action, "reason": decision.reason, "figures": decision.figures}
        promoted = decided["action"] == "promote"
        return {"version": version if promoted else parent, "candidate": version, "canary": decided}

    def _base(self) -> tuple[Path, str]:
        """The warmed base checkpoint the CLI handed over, registered as a full checkpoint."""
        from feedback.registry import BASE

        warm, version = self.target.warm_base, self.target.warm_version
        if version not in {c.version for c in self.registry.list()}:
            self.registry.register(
                version,
                "full",
                warm,
                str(self.target.base_model),
                parent=BASE,
                metrics=json.loads((warm / "warmup.json").read_text()),
            )
        return warm, version

    def run(self) -> list[dict]:
        lc, state = self.lc, self.state
        warm, base_version = self._base()
        state.data.update(warm_path=str(warm), base_version=base_version)
        state.data.setdefault("started", datetime.now(timezone.utc).isoformat())  # production rows count from here
        current = base_version
        for turn in range(1, lc.turns + 1):  # a resume serves what the last completed deploy did
            deployed = state.done(f"{turn}.deploy")
            current = deployed["version"] if deployed else current
        self.swap.deploy(self.alias, base_version)  # the warmed weights, reloaded in place
        if current != base_version and lc.release != "dedicated":
            self.swap.deploy(self.alias, current)
        self._controller().reapply(self.alias)  # a canary this run had started holds its share again
        turns = [{"turn": 0, "version": base_version, "eval": self._phase("0.eval", lambda: self._eval(0))}]
        self.report.turn(turns[-1])
        parent = base_version
        for t in range(1, lc.turns + 1):
            gather = (lambda: self._production(t, parent)) if lc.from_traces else (lambda: self._rollouts(t))
            roll = self._phase(f"{t}.rollouts", gather)
            manifest = self._phase(f"{t}.export", lambda: self._export(t, roll))
            trained = self._phase(f"{t}.train", lambda: self._train(t, parent, warm, manifest))
            released = self._phase(f"{t}.deploy", lambda: self._deploy(t, parent, trained))
            ev = self._phase(f"{t}.eval", lambda: self._eval(t))
            parent = released["version"]  # a candidate rolled back: the next turn trains from what serves
            seconds = {p: state.done(f"{t}.{p}")["seconds"] for p in PHASES}
            turns.append(
                {"turn": t, "version": parent, "eval": ev, "rollouts": roll, "train": trained["metrics"], "seconds": seconds}
                | ({"canary": released["canary"], "candidate": released["candidate"]} if "canary" in released else {})
            )
            self.report.turn(turns[-1])
        return turns
