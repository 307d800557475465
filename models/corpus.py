"""Deterministic text for training, parity checks and load tests, with no downloads.

Two sources, both present on every machine that runs this project:
- English prose: the reference topics CPython ships in ``pydoc_data.topics`` (the text of
  ``help('topics')``), split into sentences and filtered to readable ones;
- chat utterances: the intent templates in ``models/data/intents.json`` with their slots filled.

Everything is ordered and split by content hash, so every call returns the same lists.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

INTENTS_FILE = Path(__file__).parent / "data" / "intents.json"
SLOT = re.compile(r"\{(\w+)\}")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"*])")
_WORD = re.compile(r"^[A-Za-z][A-Za-z'’,;:()-]*[.!?,;:)]?$")
# reStructuredText heading underlines (~~~~, ****): markup, not prose.
_RULE = re.compile(r"([~=*^#+_-])\1{2,}")


@dataclass(frozen=True)
class IntentTemplates:
    slots: dict[str, list[str]]
    intents: dict[str, list[str]]


@cache
def intent_templates() -> IntentTemplates:
    data = json.loads(INTENTS_FILE.read_text())
    return IntentTemplates(slots=data["slots"], intents=data["intents"])


def fill(template: str, rng: random.Random) -> str:
    """Replace each {slot} with a value drawn from the slot's list."""
    slots = intent_templates().slots
    return SLOT.sub(lambda m: rng.choice(slots[m.group(1)]), template)


def _bucket(text: str, buckets: int) -> int:
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:4], "big") % buckets


def _readable(sentence: str) -> bool:
    words = sentence.split()
    if not 4 <= len(words) <= 70:
        return False
    if any(marker in sentence for marker in ("::=", ">>>", "===", "---", "...", "__", "|")):
        return False
    plain = sum(1 for w in words if _WORD.match(w))
    return plain / len(words) >= 0.8 and sentence[-1] in ".!?"


@cache
def prose_sentences() -> tuple[str, ...]:
    """Readable English sentences from CPython's pydoc topics, deduplicated, in a stable order."""
    import pydoc_data.topics

    seen: dict[str, None] = {}
    for key in sorted(pydoc_data.topics.topics):
        text = " ".join(_RULE.sub(" ", pydoc_data.topics.topics[key]).split())
        for sentence in _SENTENCE_END.split(text):
            sentence = sentence.strip().strip('"')
            if _readable(sentence):
                seen.setdefault(sentence, None)
    return tuple(seen)


def chat_utterances(per_template: int = 3, seed: int = 0) -> list[tuple[str, str]]:
    """(utterance, intent) pairs: every template filled ``per_template`` times."""
    rng = random.Random(seed)
    out: dict[str, str] = {}
    for intent, templates in sorted(intent_templates().intents.items()):
        for template in templates:
            for _ in range(per_template):
                out.setdefault(fill(template, rng), intent)
    return list(out.items())


def split(texts: tuple[str, ...] | list[str], part: str) -> list[str]:
    """A stable partition by content hash: 'train' (80 %), 'parity' (10 %), 'heldout' (10 %)."""
    ranges = {"train": range(0, 8), "parity": range(8, 9), "heldout": range(9, 10)}
    wanted = ranges[part]
    return [t for t in texts if _bucket(t, 10) in wanted]


def training_lines() -> Iterator[str]:
    """The SentencePiece training corpus: all prose and chat utterances."""
    yield from prose_sentences()
    for text, _ in chat_utterances():
        yield text


def _drop_words(sentence: str, rng: random.Random, fraction: float) -> str:
    words = sentence.split()
    keep = [w for w in words if rng.random() >= fraction] or words[:1]
    return " ".join(keep)


def sentence_pairs(count: int = 600, seed: int = 3) -> list[tuple[str, str]]:
    """STS-style pairs whose similarities spread across [0, 1], so a 0/1 threshold is tested.

    Mixes near-paraphrases (words dropped), neighbouring sentences on the same topic, unrelated
    sentences, and chat utterances of the same or different intents. Drawn only from the 'parity'
    partition of the prose, so they are held out from nothing the services were tuned on.
    """
    rng = random.Random(seed)
    prose = split(prose_sentences(), "parity")
    chats = chat_utterances(per_template=1, seed=seed)
    by_intent: dict[str, list[str]] = {}
    for text, intent in chats:
        by_intent.setdefault(intent, []).append(text)
    intents = sorted(by_intent)
    pairs: list[tuple[str, str]] = []
    while len(pairs) < count:
        kind = len(pairs) % 5
        if kind == 0:
            s = rng.choice(prose)
            pairs.append((s, _drop_words(s, rng, rng.uniform(0.2, 0.6))))
        elif kind == 1:
            i = rng.randrange(len(prose) - 1)
            pairs.append((prose[i], prose[i + 1]))
        elif kind == 2:
            pairs.append((rng.choice(prose), rng.choice(prose)))
        elif kind == 3:
            texts = by_intent[rng.choice(intents)]
            pairs.append((rng.choice(texts), rng.choice(texts)))
        else:
            a, b = rng.sample(intents, 2)
            pairs.append((rng.choice(by_intent[a]), rng.choice(by_intent[b])))
    return pairs


def heldout_sentences(count: int = 256, seed: int = 5) -> list[str]:
    """Sentences for accuracy gates (int8), from the 'heldout' partition, mixed lengths."""
    rng = random.Random(seed)
    prose = split(prose_sentences(), "heldout")
    chats = [t for t, _ in chat_utterances(per_template=1, seed=seed)]
    out = rng.sample(prose, min(len(prose), count * 3 // 4))
    out += rng.sample(chats, count - len(out))
    return out


def calibration_sentences(count: int = 512) -> list[str]:
    """Sentences the int8 build calibrates on (activation ranges for SmoothQuant): prose of the
    'train' partition, in the corpus's order (no chat utterances); none is among the held-out
    sentences its accuracy gate checks."""
    return split(prose_sentences(), "train")[:count]


def load_texts(seed: int = 11) -> list[str]:
    """The load-test corpus: prose and chat utterances shuffled together (3–120 word pieces)."""
    rng = random.Random(seed)
    texts = list(prose_sentences()) + [t for t, _ in chat_utterances(per_template=2, seed=seed)]
    rng.shuffle(texts)
    return texts
