"""Simulated production users: a verifiers taskset playing the user. Batch after batch, they send
its tasks through the gateway as one team (a session per episode, sampled at temperature 1, as
the model serving the alias answers), and post their own reward as feedback the way real users
do: some of it late, some of it never.

Used by ``deploy/bench/production.py`` and the tests of the loop on production traffic. They run
on a thread of their own until :meth:`TasksetUsers.stop`; every episode, failed request and
posted or withheld reward is counted.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

from envs.vf_run import play, post_feedback, reward_feedback


@dataclass
class UsersCount:
    batches: int = 0
    episodes: int = 0
    failed: int = 0  # episodes whose requests did not all succeed
    rewards_posted: int = 0  # episodes whose reward was posted
    rewards_withheld: int = 0  # episodes whose user never said
    reward_sum: float = 0.0  # of every episode's own reward, posted or not


class TasksetUsers:
    def __init__(
        self,
        taskset: str,
        gateway_url: str,
        key: str,
        alias: str,
        tasks: int,
        per_task: int = 8,
        max_tokens: int = 8,
        missing: float = 0.1,
        max_delay_s: float = 3.0,
        env_prefix: str = "users",
        taskset_args: dict | None = None,
        seed: int = 0,
    ):
        """Each batch: ``per_task`` episodes of each of the taskset's first ``tasks`` tasks. A
        reward is withheld with probability ``missing`` and posted after up to ``max_delay_s``."""
        self.taskset, self.url, self.key, self.alias = taskset, gateway_url, key, alias
        self.tasks, self.per_task, self.max_tokens = tasks, per_task, max_tokens
        self.missing, self.max_delay_s, self.prefix, self.args = missing, max_delay_s, env_prefix, taskset_args
        self.count = UsersCount()
        self.errors: list[str] = []
        self.failures: list[str] = []  # why failed episodes failed (the first 20)
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._posts: list[threading.Timer] = []
        self._thread = threading.Thread(target=self._run, name="simulated-users", daemon=True)

    def start(self) -> "TasksetUsers":
        self._thread.start()
        return self

    def stop(self) -> UsersCount:
        """Finish the batch under way, post every reward still due; the counts."""
        self._stop.set()
        self._thread.join()
        for post in self._posts:
            post.join()
        return self.count

    def _run(self) -> None:
        while not self._stop.is_set():
            env_id = f"{self.prefix}-b{self.count.batches}"
            try:
                self._batch(env_id)
            except Exception as exc:  # counted and shown by whoever stops them; the users go on
                self.errors.append(f"{env_id}: {type(exc).__name__}: {exc}")
                self._stop.wait(1.0)

    def _batch(self, env_id: str) -> None:
        results = play(
            self.taskset,
            self.url,
            self.key,
            self.alias,
            n=self.tasks,
            rollouts=self.per_task,
            max_tokens=self.max_tokens,
            temperature=1.0,
            env_id=env_id,
            taskset_args=self.args,
        )
        self.count.batches += 1
        self.count.episodes += len(results)
        self.count.failed += sum(not r.ok for r in results)
        self.failures.extend(f"{env_id}/{r.example_id}: {r.failure}" for r in results if not r.ok)
        del self.failures[20:]
        self.count.reward_sum += sum(r.reward for r in results)
        for episode in reward_feedback(self.url, self.key, results, f"user:{env_id}"):
            if self._rng.random() < self.missing:
                self.count.rewards_withheld += 1
                continue
            post = threading.Timer(self._rng.uniform(0, self.max_delay_s), self._post, [episode])
            post.daemon = True
            self._posts.append(post)
            post.start()

    def _post(self, episode: list[dict]) -> None:
        try:
            post_feedback(self.url, self.key, episode)
            self.count.rewards_posted += 1
        except Exception as exc:
            self.errors.append(f"feedback: {type(exc).__name__}: {exc}")


def main() -> None:
    """Run the users until SIGTERM or SIGINT; their counts, as JSON in ``--counts``, every 2 s and
    once they have stopped."""
    import argparse
    import json
    import signal
    from dataclasses import asdict
    from pathlib import Path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("taskset", help="a verifiers taskset, e.g. envs.vf_wordops")
    ap.add_argument("--gateway", required=True)
    ap.add_argument("--key-file", required=True, type=Path, help="a file holding the users' team key")
    ap.add_argument("--alias", default="tiny")
    ap.add_argument("--tasks", type=int, default=32, help="the taskset's first TASKS tasks are the users' prompts")
    ap.add_argument("--per-task", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--missing", type=float, default=0.1, help="share of rewards never posted")
    ap.add_argument("--max-delay-s", type=float, default=3.0, help="a reward is posted up to this late")
    ap.add_argument("--env-prefix", default="users")
    ap.add_argument("--counts", type=Path, required=True, help="where the counts go (every 2 s)")
    args = ap.parse_args()
    users = TasksetUsers(
        args.taskset,
        args.gateway,
        args.key_file.read_text().strip(),
        args.alias,
        args.tasks,
        args.per_task,
        args.max_tokens,
        args.missing,
        args.max_delay_s,
        args.env_prefix,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def write() -> None:  # atomically: a reader never sees half a file
        tmp = args.counts.with_suffix(".tmp")
        tmp.write_text(json.dumps({**asdict(users.count), "errors": users.errors, "failures": users.failures}))
        tmp.replace(args.counts)

    users.start()
    while not stop.wait(2.0):
        write()
    users.stop()
    write()


if __name__ == "__main__":
    main()
