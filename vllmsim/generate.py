"""A stand-in tokenizer and text source: deterministic pseudo-words and token ids.

Ids of the special tokens are Qwen3's, because real reports quote them (`</think>` = 248069,
eos `<|im_end|>` = 248046, "\\n\\n" = 271), so checks written against real vLLM work here too.
"""

from __future__ import annotations

import enum
import random
import re
import zlib
from dataclasses import dataclass

THINK_END_ID = 248069
EOS_ID = 248046
_FIXED_IDS = {
    "\n\n": 271,
    " ": 220,
    "\n": 198,
    "\t": 197,
    "2": 17,
    "{": 90,
    "}": 92,
    ":": 25,
    '"': 1,
    "</think>": THINK_END_ID,
    "<|im_end|>": EOS_ID,
}
_VOCAB_BASE, _VOCAB_SIZE = 1000, 150_000
_PIECES = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")
_TEXT_WORDS = (
    "the",
    "model",
    "server",
    "request",
    "token",
    "answer",
    "value",
    "first",
    "result",
    "check",
    "simple",
    "number",
    "cache",
    "batch",
    "decode",
    "draft",
    "layer",
    "output",
    "input",
    "state",
    "is",
    "a",
    "of",
    "and",
    "to",
    "in",
    "we",
    "so",
    "this",
    "that",
    "with",
    "for",
    "two",
    "step",
)
_THINK_WORDS = (
    "let",
    "me",
    "think",
    "about",
    "the",
    "question",
    "first",
    "consider",
    "so",
    "then",
    "maybe",
    "check",
    "again",
    "okay",
    "answer",
    "should",
    "be",
    "wait",
    "yes",
    "right",
)


class Channel(enum.Enum):
    REASONING = "reasoning"
    CONTENT = "content"
    TOOL = "tool"  # tool-call markup the tool parser turns into message.tool_calls
    CONTROL = "control"  # </think> and eos: counted, never shown


@dataclass(frozen=True)
class Token:
    id: int
    text: str
    channel: Channel


def token_id(text: str) -> int:
    fixed = _FIXED_IDS.get(text)
    if fixed is not None:
        return fixed
    return _VOCAB_BASE + zlib.crc32(text.encode()) % _VOCAB_SIZE


def tokenize(text: str, channel: Channel) -> list[Token]:
    """Word-ish pieces (leading whitespace glued to the word), like a BPE would roughly cut."""
    return [Token(token_id(p), p, channel) for p in _PIECES.findall(text)]


def words(rng: random.Random, count: int, channel: Channel, *, thinking: bool = False) -> list[Token]:
    """`count` pseudo-word tokens; sentences end with a period so text reads like text."""
    pool = _THINK_WORDS if thinking else _TEXT_WORDS
    out: list[Token] = []
    for i in range(count):
        if i and i % 9 == 8:
            piece = "."
        else:
            word = rng.choice(pool)
            piece = word.capitalize() if i == 0 or out[-1].text == "." else word
            piece = piece if i == 0 else " " + piece
        out.append(Token(token_id(piece), piece, channel))
    return out


def control(token_id_: int, text: str) -> Token:
    return Token(token_id_, text, Channel.CONTROL)


def whitespace(rng: random.Random, count: int, *, residue: bool) -> list[Token]:
    """A degenerate whitespace run: spaces and newlines, or (the silent residue) spaces, tabs and
    quote+newline pairs."""
    pieces = (" ", "\t", '"\n') if residue else (" ", "\n", "\n\n")
    return [Token(token_id(p), p, Channel.CONTENT) for p in (rng.choice(pieces) for _ in range(count))]
