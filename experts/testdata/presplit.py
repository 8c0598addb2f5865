#!/usr/bin/env python3
"""Writes presplit.json: texts and the pieces each pre-tokenizer cuts them into.

The reference for experts/tokenize_split.go (TestTokenizePreSplitGolden).
Needs Python 3 and the `regex` module (pip install regex); run from
experts/testdata:

    python3 presplit.py > presplit.json

The patterns are llama.cpp's for each tokenizer.ggml.pre (src/llama-vocab.cpp,
llm_tokenizer_bpe). A pre-tokenizer is a list of patterns applied in turn,
each to the pieces of the one before; a match and the text between two
matches both become pieces (HuggingFace's "Isolated" Split). The
contractions are written as llama.cpp rewrites them ('[sS]...): ASCII case
only, where (?i:...) would also fold U+017F.

The texts are random concatenations of fragments chosen to tell the
patterns apart: contractions in every case, digit runs of 1 to 7 (ASCII,
Arabic-Indic, full-width, other numbers), CJK in and out of DeepSeek-V3's
ranges, accents precomposed and combining, emoji with modifiers and joiners,
runs of \r and \n, trailing and Unicode spaces, punctuation and symbol runs.
Characters are all assigned in Unicode 14, so Go's tables agree with the
regex module's. The seed is fixed: the output is the same on every run.
"""

import json
import random
import sys

import regex

CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

PRE = {
    "gpt2": [
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    ],
    "llama-bpe": [
        CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ],
    "qwen2": [
        CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ],
    "deepseek-v3": [
        r"\p{N}{1,3}",
        r"[一-龥぀-ゟ゠-ヿ]+",
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ],
    # Patterns copied from llama.cpp as they are (plain strings, not raw:
    # some classes hold characters written as \u escapes).
    "starcoder": [
        "\\p{N}",
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ],
    "falcon": [
        "[\\p{P}\\$\\+<=>\\^~\\|`]+",
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        "[0-9][0-9][0-9]",
    ],
    "deepseek-llm": [
        "[\\r\\n]",
        "\\s?[A-Za-z\u00b5À-ÖØ-öø-ƺƼ-ƿ\u01c4-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-\u03f5Ϸ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼ\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149ⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿ\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e‘-‟\u3000-。]+",
        "\\s+$",
        "[一-龥ࠀ-一가-\ud7ff]+",
        "\\p{N}+",
    ],
    "deepseek-coder": [
        "[\\r\\n]",
        "\\s?\\p{L}+",
        "\\s?\\p{P}+",
        "[一-龥ࠀ-一가-\ud7ff]+",
        "\\p{N}",
    ],
}


def split(text, patterns):
    pieces = [text]
    for p in patterns:
        out = []
        for s in pieces:
            pos = 0
            for m in p.finditer(s):
                assert m.end() > m.start(), (p.pattern, s)
                if m.start() > pos:
                    out.append(s[pos:m.start()])
                out.append(m.group())
                pos = m.end()
            if pos < len(s):
                out.append(s[pos:])
        pieces = out
    assert "".join(pieces) == text
    return pieces


FRAGMENTS = [
    # contractions, any case, and near misses
    "'s", "'S", "'t", "'T", "'re", "'RE", "'rE", "'ve", "'Ve", "'m", "'M",
    "'ll", "'LL", "'lL", "'d", "'D", "'x", "'", "''", "'ſ", "don't", "I'M",
    "we'Re", "you'LL", "it's", "O'Neil",
    # words
    "a", "hello", "World", "ABC", "xYz", "the", "_id", "foo_bar",
    # digits
    "0", "12", "345", "6789", "01234", "987654", "1234567", "٣", "١٢٣٤",
    "１２３", "²", "½", "Ⅻ", "3.14", "1,000",
    # CJK: in DeepSeek-V3's ranges, at their edges, and out of them
    "日本語", "中文", "一", "龥", "龦", "鿿", "ひらがな", "カタカナ", "ー", "゛",
    "・", "゠", "ゟ", "한국어", "㐀", "々", "〆", "。", "、", "，", "！", "（", "）",
    # letters with accents, other scripts, marks
    "é", "e\u0301", "ñ", "Ä", "ß", "ſ", "αβγ", "Привет", "مرحبا", "नमस्ते",
    "สวัสดี", "ʰ", "ª", "\u0301", "\u0301\u0301a",
    # emoji
    "😀", "👍🏽", "❤️", "👨‍👩‍👧", "🇫🇷",
    # line breaks and spaces
    "\r", "\n", "\r\n", "\n\n", "\r\n\r\n", "\n\r", " \n", "\t\n", " ", "\u2009",
    "  ", "   ", "\t", "\u3000", "\u00a0", "\u2028", "\u0085", "\x0b",
    # punctuation and symbols
    "...", "!?", "--", "~", "~~", "`", "$", "+", "<=>", "@#", "“", "”", "«»",
    "\\", "|", "^", "∑", "√", "€", "£", "¥", "©", "°", "§", "(", ")", "[]",
    "{}", "\"", ",", ".", ":", ";", "?!", "#!", "-", "_",
    # controls and format characters
    "\x01", "\x1c", "\x7f", "\u200b", "\u200d", "\ufeff",
]

FIXED = [
    "Hello world", "I'M here, you'LL see", "don't 'Re-do", "1234567",
    "a  1", "a   b", "a \n b", "x\r\n\r\n  y", "trailing  ", "  leading",
    "日本語123abc", "カタカナ゛です", "数字12345と漢字", "'Hello", ".éa",
    "e\u0301t\u0301e\u0301", "\u0301x", "a\x01\x01b", "\x01\x01", "~~x",
    "$100", "(a+b)", "😀😀abc", "line1\r\nline2\n\n\nline3", "tab\tsep\t",
    "\u3000\u3000x", "nb\u00a0sp", "x \u3000y", "1 2  3   4", "...\n\n",
]


def main():
    rnd = random.Random(20)
    texts = list(FIXED)
    while len(texts) < 300:
        parts = [rnd.choice(FRAGMENTS) for _ in range(rnd.randint(1, 6))]
        t = "".join(parts) if rnd.random() < 0.5 else " ".join(parts)
        if t not in texts:
            texts.append(t)
    pres = {name: [regex.compile(p) for p in ps] for name, ps in PRE.items()}
    out = sys.stdout
    out.write("[\n")
    for i, t in enumerate(texts):
        case = {"text": t}
        for name, ps in pres.items():
            case[name] = split(t, ps)
        out.write(json.dumps(case, ensure_ascii=True))
        out.write(",\n" if i < len(texts) - 1 else "\n")
    out.write("]\n")


if __name__ == "__main__":
    main()
