"""verifiers taskset (``verifiers.v1``): reverse a word, with the partial-credit reward of
``envs.reverse``. Load it as taskset id ``envs.vf_reverse``."""

from __future__ import annotations

import verifiers.v1 as vf

from envs import reverse


class ReverseData(vf.TaskData):
    answer: str


class ReverseTask(vf.Task[ReverseData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        task = reverse.Task(example_id=self.data.id, prompt="", answer=self.data.answer)
        return reverse.reward(task, trace.last_reply)


class ReverseConfig(vf.TasksetConfig):
    n: int = 16
    seed: int = 0


class ReverseTaskset(vf.Taskset[ReverseTask, ReverseConfig]):
    def load(self):
        for t in reverse.tasks(self.config.n, self.config.seed):
            yield ReverseTask(ReverseData(prompt=t.prompt, answer=t.answer, id=t.example_id), self.config.task)


__all__ = ["ReverseTaskset"]
