"""A family of word-list tasks: ``Apply NAME to: w1 w2 w3`` -> an operation on the words.

The operations (copy, reverse, first, last) act on whole words, each one token of the tiny
model's tokenizer, so a 4-layer model can learn them in a couple of minutes on CPU. The *name*
is what a task is about: the warm-up (``deploy/models/warm_model.py``) teaches four names per
operation and, for a fifth of its examples, a throwaway name with a random operation, so that a
name the model has never seen makes it try each of its skills. A task whose name it never saw
(``tail`` = the last word for the demo, ``head`` = the first in the tests) is then something RL
can discover from the reward alone: the warmed model gets ``tail`` right about 3 times in 10,
greedy or sampled.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

OPERATIONS: dict[str, Callable[[list[str]], list[str]]] = {
    "copy": lambda ws: list(ws),
    "reverse": lambda ws: list(ws)[::-1],
    "first": lambda ws: list(ws)[:1],
    "last": lambda ws: list(ws)[-1:],
}
# What the warm-up calls each operation.
KNOWN_NAMES = {
    "copy": ["copy", "keep", "same", "exact"],
    "reverse": ["order", "other", "under", "left"],
    "first": ["first", "start", "begin", "initial"],
    "last": ["last", "final", "end", "stop"],
}
# Names the warm-up never shows: the tasks RL is asked to learn.
UNSEEN_NAMES = ["back", "tail", "head", "top"]
# Throwaway names, each paired with a random operation every time the warm-up uses one.
THROWAWAY_NAMES = """clear wor extra log must while write filename strings compatibility input present
package such search necessary representing loop messages path grouping indent items wrapper chunk
chunks they map reader parser via network heap will self inte warnings have multiple give info raised
row mailbox run flag net best act state statement err caps hash most assert readline cho buffering
files has writ source conn off integer wrap allowed obj reserved without errors readable otherwise
work equal negative language instance ans parts with any ref col and skip buffer command diffe some
audio size giving bet ext classes when even""".split()
# The words tasks are made of (each a single token with its leading space).
WORDS = """next conflict prefixlen isinstance timezone linesep mat locale correct point compare because
pop bound memory itself dis this sep encoding methods then know auto expression local pro override many
make lib tag side form seconds removed dict opcode different partial unt instead callers release step
protocol dest msg exists vars proto optionflags cannot pack delim text commands two entries consume
single raiseit parame abstract old exec actual can where method original limit exception parameter
still avoid operand sequence part rest bool verbose orig already tests push del don reg occur previous
import setting locals builtins done you function imp count display pdb for charac headers digits
optional generator accept convert byte ins profile temp docstring like non containing attribute strip
encoded now complex doctest report var represent real string argument build buil hex extension table
from leading built eval tuples section getattr digest here results into sign conversion errno changes
default member trans cyc information env matches stream once yield importlib kind groups large loader
con names seek paths header possib platform literal iter relative takes specified valid out appro tra
div who modif true decorator modulo bytes indi return indic glob formatter complete sock context
documentation annot available""".split()
MIN_WORDS, MAX_WORDS = 2, 4


@dataclass(frozen=True)
class WordTask:
    example_id: str
    name: str
    words: tuple[str, ...]
    operation: str

    @property
    def prompt(self) -> str:
        return prompt(self.name, self.words)

    @property
    def answer(self) -> str:
        return " ".join(OPERATIONS[self.operation](list(self.words)))


def prompt(name: str, words: Sequence[str]) -> str:
    return f"Apply {name} to: {' '.join(words)}"


def tasks(name: str, operation: str, n: int, seed: int = 0) -> list[WordTask]:
    """``n`` distinct tasks for ``name`` (the same seed gives the same tasks)."""
    rng, seen, out = random.Random(f"{name}-{operation}-{seed}"), set(), []
    while len(out) < n:
        words = tuple(rng.sample(WORDS, rng.randint(MIN_WORDS, MAX_WORDS)))
        if words in seen:
            continue
        seen.add(words)
        out.append(WordTask(f"{name}-{len(out)}", name, words, operation))
    return out


def exact(task: WordTask, reply: str | None) -> float:
    return 1.0 if (reply or "").split() == task.answer.split() else 0.0


def overlap(task: WordTask, reply: str | None) -> float:
    """Shaping only: the share of answer positions the reply gets right, less a share for each
    extra word."""
    got, want = (reply or "").split(), task.answer.split()
    hits = sum(1 for a, b in zip(got, want) if a == b)
    return max(0.0, hits - max(0, len(got) - len(want))) / len(want)
