"""verifiers taskset (``verifiers.v1``): multi-turn arithmetic with a calculator tool.

The model is given the ``calculate`` tool (OpenAI ``tools`` in the request; on the tiny GLM
model the call is written as ``<tool_call>calculate<arg_key>expression</arg_key>...``), gets
the result back as a ``tool`` message, and must answer with the number. Reward 1.0 for the
right number in the final reply. Load it as taskset id ``envs.vf_calc``.
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf

from envs.vf_calc_tools import CalcToolset, evaluate


class CalcData(vf.TaskData):
    expression: str
    answer: str


class CalcTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CalcTask(vf.Task[CalcData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        numbers = re.findall(r"-?\d+(?:\.\d+)?", trace.last_reply or "")
        return 1.0 if numbers and numbers[-1] == self.data.answer else 0.0


class CalcConfig(vf.TasksetConfig):
    task: CalcTaskConfig = CalcTaskConfig()
    n: int = 8
    seed: int = 0


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for i in range(self.config.n):
            a, b, c = rng.randint(2, 40), rng.randint(2, 40), rng.randint(2, 9)
            expr = f"({a} + {b}) * {c}"
            yield CalcTask(
                CalcData(
                    prompt=f"Use the calculate tool to compute {expr}, then give the number.",
                    expression=expr,
                    answer=str(int(evaluate(expr))),
                    id=f"calc-{i}",
                ),
                self.config.task,
            )


__all__ = ["CalcTaskset"]
