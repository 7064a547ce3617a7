"""Bundled sequence-to-sequence tasks, generated offline and deterministically.

`numbers-en-de`: English number words to German number words, with num2words. It is a real mapping with
reordering: "three hundred and forty-two" -> "dreihundertzweiundvierzig" (units before tens in German,
compounds written as one word). Numbers are drawn with a uniform number of digits (1 to 6) so short and
long sentences are both common; each number lands in exactly one split, chosen by a hash of the number.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache

from num2words import num2words

from twostep.errors import BadInput

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class Task:
    name: str
    src_lang: str
    tgt_lang: str
    sizes: tuple[int, int, int]  # train, dev, test
    max_digits: int = 6
    seed: int = 20240601

    def example(self, n: int) -> tuple[str, str]:
        return num2words(n, lang=self.src_lang), num2words(n, lang=self.tgt_lang)

    @cache  # noqa: B019 (the tasks are a few module-level constants: nothing to leak)
    def numbers(self) -> dict[str, tuple[int, ...]]:
        """Each number's split is fixed by a hash of the number itself, so every split sees the same
        distribution (short numbers included) and changing a split's size never moves another's numbers."""
        rng = random.Random(self.seed)
        splits: dict[str, list[int]] = {name: [] for name in SPLITS}
        sizes = dict(zip(SPLITS, self.sizes))
        seen: set[int] = set()
        while any(len(splits[name]) < sizes[name] for name in SPLITS):
            digits = rng.randint(1, self.max_digits)
            n = rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)
            if n in seen:
                continue
            seen.add(n)
            u = ((n + self.seed) * 0x9E3779B1 % 2**32) / 2**32  # Knuth's multiplicative hash, in [0, 1)
            name = "test" if u < 0.03 else "dev" if u < 0.045 else "train"
            if len(splits[name]) < sizes[name]:
                splits[name].append(n)
        return {name: tuple(numbers) for name, numbers in splits.items()}

    def split(self, name: str) -> list[tuple[str, str]]:
        if name not in SPLITS:
            raise BadInput(f"unknown split {name!r}; choose one of {', '.join(SPLITS)}")
        return [self.example(n) for n in self.numbers()[name]]


TASKS = {
    "numbers-en-de": Task("numbers-en-de", "en", "de", sizes=(60000, 500, 1000)),
    "numbers-en-fr": Task("numbers-en-fr", "en", "fr", sizes=(60000, 500, 1000)),
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise BadInput(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[name]
