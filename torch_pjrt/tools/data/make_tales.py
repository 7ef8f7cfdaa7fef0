"""Generate tales.txt, the char-level GPT's training text, from a small story grammar.

The grammar and every word list below were written for torch-pjrt; the generated text
is dedicated to the public domain (CC0 1.0). Deterministic: the same seed gives the same
file. Run `python torch_pjrt/tools/data/make_tales.py` to rebuild it.
"""
from __future__ import annotations

import random
from pathlib import Path

ANIMALS = ["fox", "crow", "hare", "tortoise", "owl", "wolf", "lamb", "mouse", "lion", "ant", "grasshopper",
           "heron", "goat", "badger", "otter", "sparrow", "bear", "frog", "stag", "cat"]
PEOPLE = ["miller", "shepherd", "fisherman", "old woman", "young king", "baker", "weaver", "woodcutter",
          "sailor", "farmer's daughter", "blacksmith", "beggar", "merchant", "little girl", "old soldier"]
PLACES = ["by the river", "at the edge of the forest", "on the high hill", "in the village square",
          "beside the old mill", "under the great oak", "near the frozen lake", "in the valley",
          "on the windy shore", "at the crossroads", "in the king's garden", "behind the barn"]
TIMES = ["One morning", "Long ago", "On a cold winter night", "One summer evening", "Once upon a time",
         "In the days of the old king", "At the first light of spring", "One rainy afternoon"]
THINGS = ["a golden key", "a loaf of bread", "a silver bell", "a basket of apples", "a lantern",
          "a wooden box", "a piece of cheese", "an old map", "a bag of grain", "a red ribbon",
          "a jar of honey", "a broken wheel", "a feather", "a coin"]
WANTS = ["wanted to cross the river", "was looking for something to eat", "hoped to become rich",
         "wished to be the wisest of all", "could not find the way home", "longed to see the sea",
         "was afraid of the dark", "wanted to win the race", "had lost a friend", "was tired of working"]
ADJ = ["clever", "proud", "hungry", "gentle", "foolish", "patient", "greedy", "brave", "lazy", "kind",
       "curious", "quiet", "honest", "vain"]
SAYS = ["said", "asked", "cried", "whispered", "answered", "laughed", "called out"]
LINES = [
    "What are you doing here, friend?",
    "I will help you, if you will help me.",
    "There is no shame in asking for help.",
    "Why should I share what I have found?",
    "Wait here, and I will come back before dark.",
    "Slow and steady, that is my way.",
    "Do not trust every sweet word you hear.",
    "The road is long, but we will walk it together.",
    "I was wrong, and I am sorry.",
    "Look, the sun is coming up over the hill!",
    "Give me that, and you shall have half of my supper.",
    "Who goes there, in the middle of the night?",
]
EVENTS = [
    "Then the wind began to blow, and the rain fell hard upon the fields.",
    "But the bridge was old, and it cracked beneath their feet.",
    "Soon the night came down, and the stars came out one by one.",
    "At that moment a great noise was heard from the forest.",
    "The river rose higher and higher, until it covered the path.",
    "They walked for three days and three nights without rest.",
    "Nobody in the village believed a word of the story.",
    "When the bell rang at noon, everyone ran to the square.",
    "The snow lay deep on the ground, and there was nothing to eat.",
    "Far away, a light was shining in the window of a small house.",
]
ENDINGS = [
    "And so the {a} went home, a little wiser than before.",
    "From that day on, the {a} and the {b} were the best of friends.",
    "The {b} laughed, but the {a} never forgot the lesson.",
    "In the end the {a} had nothing, and the {b} had everything.",
    "And they shared {t} between them, and nobody went hungry that winter.",
    "The {a} was never seen {p} again.",
]
MORALS = [
    "Those who share are never alone.", "Pride goes before a fall.", "Slow and steady wins the race.",
    "A friend in need is a friend indeed.", "Do not count your chickens before they hatch.",
    "Honesty is the best policy.", "Look before you leap.", "Little by little does the trick.",
    "Kindness is never wasted.", "The greedy lose what they have.", "Work today, and eat tomorrow.",
    "Appearances often deceive.",
]


def an(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def verb(rng: random.Random, line: str) -> str:
    return "asked" if line.endswith("?") else rng.choice([v for v in SAYS if v != "asked"])


def tale(rng: random.Random, number: int) -> str:
    cast = ANIMALS + PEOPLE
    a, b = rng.sample(cast, 2)
    adj_a, adj_b = rng.sample(ADJ, 2)
    place, thing = rng.choice(PLACES), rng.choice(THINGS)
    out = [f"{number}. THE {adj_a.upper()} {a.upper()} AND THE {b.upper()}", ""]
    para = [f"{rng.choice(TIMES)}, {an(adj_a)} {a} lived {place}.",
            f"The {a} {rng.choice(WANTS)}.",
            f"One day the {a} met {an(adj_b)} {b}, who was carrying {thing}."]
    out.append(" ".join(para))
    for _ in range(rng.randint(2, 4)):
        speaker = rng.choice([a, b])
        other = b if speaker == a else a
        line = rng.choice(LINES)
        if rng.random() < 0.5:
            quoted = line[:-1] + "," if line.endswith(".") else line
            out.append(f'"{quoted}" {verb(rng, line)} the {speaker}.')
        else:
            out.append(f'The {speaker} looked at the {other} and {verb(rng, line)}, "{line}"')
        if rng.random() < 0.6:
            out.append(rng.choice(EVENTS))
    out.append(rng.choice(ENDINGS).format(a=a, b=b, t=thing, p=place))
    out.append(f"Moral: {rng.choice(MORALS)}")
    return "\n".join(out) + "\n\n"


def build(target_bytes: int = 200_000, seed: int = 1234) -> str:
    rng = random.Random(seed)
    parts, size, n = [], 0, 1
    while size < target_bytes:
        t = tale(rng, n)
        parts.append(t)
        size += len(t)
        n += 1
    return "".join(parts)


if __name__ == "__main__":
    path = Path(__file__).with_name("tales.txt")
    path.write_text(build(), encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)")
