"""Fuzzing the front end: mutated fixture texts raise only hlotune's own errors (or parse and verify)."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hlotune.errors import HlotuneError
from hlotune.ir.parser import parse_hlo
from hlotune.ir.printer import print_module
from hlotune.ir.verify import verify_module

DATA = Path(__file__).resolve().parents[1] / "data" / "models"
TEXTS = [p.read_text() for p in sorted(DATA.glob("*/*.hlo")) if p.stat().st_size < 12_000]
_TOKENS = re.compile(r"[A-Za-z_%][\w.\-$%]*|-?\d+(?:\.\d+)?(?:e-?\d+)?|\s+|.")
TOKENIZED = [_TOKENS.findall(t) for t in TEXTS]
_WORDS = sorted({tok for toks in TOKENIZED for tok in toks if tok[:1].isalpha() or tok[:1] in "_%"})
_ODD = ["{", "}", "(", ")", "[", "]", ",", "=", '"', "\\", ":", "->", "x", "_", "/*", "*/", "\n", " ", "-",
        "(" * 200, "{" * 50, "f32[", "u64[2]", "token[]", "ROOT ", "ENTRY ", "%", "s32[]", "pred[3]", "nan", "-inf"]
_NUMBERS = st.one_of(st.integers(-3, 20), st.integers(-(2**40), 2**70)).map(str)


@st.composite
def mutated(draw) -> str:
    k = draw(st.integers(0, len(TOKENIZED) - 1))
    toks = list(TOKENIZED[k])
    for _ in range(draw(st.integers(1, 4))):
        if not toks:
            break
        i = draw(st.integers(0, len(toks) - 1))
        kind = draw(st.sampled_from(["delete", "duplicate", "swap", "number", "word", "odd", "line"]))
        if kind == "delete":
            del toks[i]
        elif kind == "duplicate":
            toks.insert(i, toks[i])
        elif kind == "swap":
            j = draw(st.integers(0, len(toks) - 1))
            toks[i], toks[j] = toks[j], toks[i]
        elif kind == "number":
            nums = [n for n, t in enumerate(toks) if t[:1].isdigit() or t[:2].startswith("-")]
            if nums:
                toks[draw(st.sampled_from(nums))] = draw(_NUMBERS)
        elif kind == "word":  # names, opcodes, element types, attribute keys: swapped for another word
            words = [n for n, t in enumerate(toks) if t[:1].isalpha() or t[:1] in "_%"]
            if words:
                toks[draw(st.sampled_from(words))] = draw(st.sampled_from(_WORDS))
        elif kind == "odd":
            toks.insert(i, draw(st.sampled_from(_ODD)))
        else:  # delete or duplicate a whole line
            text = "".join(toks).split("\n")
            n = draw(st.integers(0, len(text) - 1))
            text[n:n + 1] = [] if draw(st.booleans()) else [text[n], text[n]]
            toks = _TOKENS.findall("\n".join(text))
    return "".join(toks)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated())
def test_mutated_text_raises_only_hlotune_errors(text: str) -> None:
    try:
        m = verify_module(parse_hlo(text, file="fuzz.hlo"))
    except HlotuneError as e:
        assert e.line is None or e.line >= 1
        assert str(e)
        return
    assert parse_hlo(print_module(m)) == m  # whatever survives still round-trips
