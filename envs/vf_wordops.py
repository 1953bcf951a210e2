"""verifiers taskset (``verifiers.v1``) for the word-list family of ``envs.wordops``.

Load it as taskset id ``envs.vf_wordops``; ``instruction`` and ``operation`` pick the task (the default,
``tail`` = the last word, is the demo's: a name the warm-up never showed). The reward is 1.0 for the
exact answer, else at most 0.3 for the words in the right places: that part only shapes, an
exact solve is a reward of 1.0.
"""

from __future__ import annotations

import verifiers.v1 as vf

from envs import wordops

SHAPING = 0.3


class WordData(vf.TaskData):
    answer: str
    words: list[str]
    operation: str


class WordTask(vf.Task[WordData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        task = wordops.WordTask(self.data.id, "", tuple(self.data.words), self.data.operation)
        if wordops.exact(task, trace.last_reply):
            return 1.0
        return round(SHAPING * wordops.overlap(task, trace.last_reply), 4)


class WordConfig(vf.TasksetConfig):
    instruction: str = "tail"
    operation: str = "last"
    n: int = 128
    seed: int = 0


class WordTaskset(vf.Taskset[WordTask, WordConfig]):
    def load(self):
        for t in wordops.tasks(self.config.instruction, self.config.operation, self.config.n, self.config.seed):
            yield WordTask(
                WordData(prompt=t.prompt, answer=t.answer, words=list(t.words), operation=t.operation, id=t.example_id),
                self.config.task,
            )


__all__ = ["WordTaskset"]
