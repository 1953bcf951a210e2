"""A verifiers taskset the loop test defines itself (not the demo's task): ``Apply head to:
w1 w2 w3`` wants the first word, under a name the warm-up never showed. Exact answer or
nothing: no shaping. Loaded as ``tests.integration.vf_head_env:HeadTaskset``; the module also
exports a second taskset, so the ``:Class`` form is what picks it."""

import verifiers.v1 as vf

from envs import wordops


class HeadData(vf.TaskData):
    words: list[str]


class HeadTask(vf.Task[HeadData]):
    @vf.reward(weight=1.0)
    async def first_word(self, trace: vf.Trace) -> float:
        reply = (trace.last_reply or "").split()
        return 1.0 if reply == self.data.words[:1] else 0.0


class HeadConfig(vf.TasksetConfig):
    n: int = 160
    seed: int = 11


class HeadTaskset(vf.Taskset[HeadTask, HeadConfig]):
    def load(self):
        for t in wordops.tasks("head", "first", self.config.n, self.config.seed):
            yield HeadTask(HeadData(prompt=t.prompt, words=list(t.words), id=t.example_id), self.config.task)


class UnusedTaskset(HeadTaskset):
    """Here only so that the module exports two tasksets."""


class AnonymousTaskset(HeadTaskset):
    """Tasks without an id (verifiers' ``TaskData.id`` is optional)."""

    def load(self):
        for t in wordops.tasks("head", "first", self.config.n, self.config.seed):
            yield HeadTask(HeadData(prompt=t.prompt, words=list(t.words)), self.config.task)


__all__ = ["HeadTaskset", "UnusedTaskset", "AnonymousTaskset"]
