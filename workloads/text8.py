"""text8's normalisation: the character rules by which Matt Mahoney's ``wikifil.pl`` made text8
from enwik9 (``routerbench data prepare --text FILE --normalize text8``; docs/CORPORA.md)."""

from __future__ import annotations

import re

NORMALIZERS = ("none", "text8")
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# byte -> byte: A-Z lowercased, a-z kept, every other byte a space (wikifil.pl's tr/A-Z/a-z/ and
# tr/a-z/ /c, which act on bytes: a multi-byte UTF-8 character becomes spaces, never a letter)
_TEXT8_TABLE = bytes(c + 32 if 65 <= c <= 90 else c if 97 <= c <= 122 else 32 for c in range(256))
_SPACES = re.compile(rb"  +")


def text8_normalize(text: str | bytes) -> str:
    """``text`` normalised as text8 is: lowercase a-z words separated by single spaces.

    The rules are the character part of Matt Mahoney's ``wikifil.pl`` (the script that made
    text8 from enwik9), applied to the UTF-8 bytes of ``text`` as Perl applies them:

    1. ``A``-``Z`` are lowercased (ASCII only: "Ä" is not turned into a letter);
    2. each digit is spelled out between spaces: "0" -> " zero ", "1" -> " one ", ... "9" -> " nine ";
    3. every byte other than ``a``-``z`` becomes a space (so a non-ASCII character, whose UTF-8
       bytes are all >= 0x80, becomes a space; punctuation, tabs and newlines too);
    4. runs of spaces are squeezed to one.

    Unlike wikifil.pl's output (text8 itself begins with one space) there is no leading space, nor
    a trailing one. Returns a str of ``a``-``z`` and single spaces (empty when ``text`` holds no
    letter or digit). Idempotent.

    Not applied: the rest of wikifil.pl, which strips the XML and wiki markup of a Wikipedia dump
    (keeps only ``<text>`` elements, drops ``#REDIRECT`` pages, tags, ``<ref>``s, URLs,
    ``{{templates}}``, image and interlanguage links, decodes ``&amp;`` etc.). The input must
    already be plain text: run wikifil.pl on enwik8/enwik9 (its output is already normalised), or
    extract a dump's text with a tool such as WikiExtractor, then prepare with ``--normalize text8``.
    """
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    for digit, word in enumerate(DIGIT_WORDS):
        data = data.replace(str(digit).encode(), f" {word} ".encode())
    return _SPACES.sub(b" ", data.translate(_TEXT8_TABLE)).strip(b" ").decode("ascii")
