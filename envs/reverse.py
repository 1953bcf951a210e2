"""A single-turn task a tiny model can learn on CPU in minutes: reverse a short word.

The reward gives partial credit (similarity of the answer to the reversed word), so even a
random model's samples differ in reward and rejection sampling has something to select.
"""

from __future__ import annotations

import difflib
import random
from dataclasses import dataclass

WORDS = ["apple", "river", "planet", "silver", "garden", "window", "rocket", "forest",
         "candle", "bridge", "yellow", "marble", "tiger", "cloud", "pepper", "violin",
         "orange", "winter", "summer", "castle", "pencil", "button", "rabbit", "dragon"]


@dataclass(frozen=True)
class Task:
    example_id: str
    prompt: str
    answer: str


def tasks(n: int = 16, seed: int = 0) -> list[Task]:
    words = random.Random(seed).sample(WORDS, min(n, len(WORDS)))
    return [Task(example_id=f"reverse-{w}", prompt=f"Reverse the word: {w}", answer=w[::-1])
            for w in words]


def first_word(text: str | None) -> str:
    parts = (text or "").split()
    return parts[0] if parts else ""


def reward(task: Task, completion: str | None) -> float:
    """1.0 for the exact reversed word, else the similarity ratio of the first word to it."""
    guess = first_word(completion)
    if guess == task.answer:
        return 1.0
    return round(difflib.SequenceMatcher(None, guess, task.answer).ratio() * 0.9, 4)
