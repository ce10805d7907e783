"""The letter-readout rules of decision GGUFs (decisions/letter.py), against values computed by hand; the file's
metadata read (decisions/decision_file.py) on files derived here from the embedded model."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from decision_adapter.decisions.decision_file import file_temperature, read_decision_file
from decision_adapter.decisions.letter import (LetterPreparer, LetterRules, SystemOneTemplate, average_aligned,
                                               average_variants, choice_confidence, expected_score, lev_noul,
                                               llama_tojson, render_values, score_confidence, shown_options,
                                               sort_keys, variant_probabilities)
from decision_adapter.decisions.model_files import embedded_model_dir, find_gguf
from decision_adapter.decisions.prepare import Limits, Question, QuestionSource
from decision_adapter.decisions.prompt import ModelIncompatible, TemplateError

from adapter_fakes import CONTROL, FakeEngine
from decision_ggufs import TEMPERATURES, derive_head, derive_type

LEV = LetterRules("lev", tuple("ABCDEFGHI"), {"choice.small": 0.5, "choice": 1.75, "noul": 0.8})
OPENJEV = LetterRules("openjev", tuple("AB"), {"choice.3_5": 0.5, "choice": 2.0})


def test_buckets_and_temperature_lookup():
    assert [LEV.bucket(n) for n in (2, 8, 9, 26, 27)] == ["small", "small", "mid", "mid", "large"]
    assert [OPENJEV.bucket(n) for n in (2, 3, 5, 6, 10, 11)] == ["2", "3_5", "3_5", "6_10", "6_10", "11"]
    assert LEV.temperature("choice", 3) == 0.5  # type.bucket
    assert LEV.temperature("choice", 9) == 1.75  # the type alone
    assert LEV.temperature("score", 3) == 1.0  # none
    assert OPENJEV.temperature("choice", 4) == 0.5 and OPENJEV.temperature("choice", 2) == 2.0


def test_variants_outputs_and_noul_order():
    assert LEV.variants("choice", 3) == 2 and LEV.variants("score", 3) == 1 and LEV.variants("noul", 2) == 1
    assert OPENJEV.variants("choice", 3) == 1
    assert LEV.outputs("noul", 2) == 9 and LEV.outputs("choice", 4) == 4 and OPENJEV.outputs("noul", 2) == 2
    assert OPENJEV.noul_true_first and not LEV.noul_true_first


def test_variant_softmax_at_a_temperature_by_hand():
    # logits 2, 1, 0 at T = 0.5: exp(0), exp(-2), exp(-4) over their sum
    weights = [1.0, math.exp(-2.0), math.exp(-4.0)]
    assert variant_probabilities([2.0, 1.0, 0.0], 0.5) == pytest.approx([w / sum(weights) for w in weights], abs=1e-15)
    # the distance to the top logit is taken in float32, as llama.cpp takes it
    big = [16777217.0, 16777216.0]  # not representable apart in float32: one value
    assert variant_probabilities(big, 1.0) == [0.5, 0.5]


def test_forward_and_reversed_variants_are_averaged_by_option():
    forward = [0.7, 0.2, 0.1]  # options a, b, c shown a, b, c
    reversed_ = [0.5, 0.3, 0.2]  # shown c, b, a: c 0.5, b 0.3, a 0.2
    assert average_variants([forward, reversed_]) == pytest.approx([0.45, 0.25, 0.3], abs=1e-15)
    assert average_variants([forward]) == forward
    # Aligned by each variant's order into the request's order: lev's pair gives the same bits.
    assert average_aligned([forward, reversed_], [(0, 1, 2), (2, 1, 0)], 3) == average_variants([forward, reversed_])
    # Any orders: option 2 shown first by the second variant, option 0 last.
    assert average_aligned([forward, reversed_], [(0, 1, 2), (2, 0, 1)], 3) == pytest.approx(
        [(0.7 + 0.3) / 2, (0.2 + 0.2) / 2, (0.1 + 0.5) / 2], abs=1e-15)
    rng = random.Random(7)
    for _ in range(200):  # the same floats as average_variants for the reversed pair, whatever the values
        a, b = [rng.random() for _ in range(5)], [rng.random() for _ in range(5)]
        assert average_aligned([a, b], [tuple(range(5)), tuple(range(4, -1, -1))], 5) == average_variants([a, b])


def test_answers_and_confidences_by_hand():
    ratings = [0, 0, 0, 0, 0, 0, 0, 0.5, 0.5]  # ratings 7 and 8 of 0..8
    assert lev_noul(ratings) == pytest.approx((7 * 0.5 + 8 * 0.5) / 8)
    assert choice_confidence([0.5, 0.25, 0.25]) == pytest.approx((0.5 - 1 / 3) / (1 - 1 / 3))
    assert choice_confidence([1 / 3] * 3) == pytest.approx(0.0, abs=1e-15)
    assert expected_score([0.2, 0.3, 0.5]) == pytest.approx(1.3)
    # mode 2; distance 0.2*2 + 0.3*1 = 0.7; uniform spread (1 + 0 + 1) / 3
    assert score_confidence([0.2, 0.3, 0.5]) == pytest.approx(max(0.0, 1 - 0.7 / (2 / 3)))
    assert score_confidence([0.0, 0.0, 1.0]) == 1.0


def test_tojson_writes_what_llama_cpp_writes():
    value = {"b": "é\n\"q\"\\\x01", "a": [1, 2.5, 0.1, 3.14159265, 1e20, 2.0, True, None]}
    assert llama_tojson(value) == ('{"b": "é\\n\\"q\\"\\\\\\u0001", "a": [1, 2.5, 0.1, 3.14159, 1e+20, 2, true, '
                                   'null]}')
    assert llama_tojson({"k": [1, {}]}, indent=2) == '{\n  "k": [\n    1,\n    {}\n  ]\n}'
    with pytest.raises(TemplateError):
        llama_tojson({"a": 1}, sort_keys=True)
    assert list(sort_keys({"b": {"z": 1, "a": 2}, "a": 0})) == ["a", "b"]
    assert list(sort_keys({"b": {"z": 1, "a": 2}})["b"]) == ["a", "z"]


def test_file_temperatures_are_read_as_llama_server_reads_them():
    # std::to_string (six decimals), then strtof
    assert file_temperature(np.float32(0.8123456)) == float(np.float32(0.812346))
    assert file_temperature(0.5) == 0.5
    assert file_temperature(np.float32(1e-7)) == 0.0  # refused at load as not positive


@pytest.fixture(scope="session")
def derived(tmp_path_factory):
    source = find_gguf(embedded_model_dir())
    root = tmp_path_factory.mktemp("decision-ggufs")
    return {kind: derive_type(source, root / kind, kind) for kind in ("lev", "openjev")} | {
        kind: derive_head(source, root / kind, kind) for kind in ("kev", "clef")}


def test_decision_metadata_is_read_and_head_types_refused_naming_their_build(derived):
    assert read_decision_file(find_gguf(embedded_model_dir())) is None
    lev = read_decision_file(derived["lev"])
    assert lev.type == "lev" and lev.architecture == "llama"
    assert lev.temperatures == {k: file_temperature(np.float32(v)) for k, v in TEMPERATURES["lev"].items()}
    assert "{{ o.label }}" in lev.template
    with pytest.raises(ModelIncompatible, match=r"'kev'.*b11361"):
        read_decision_file(derived["kev"])
    with pytest.raises(ModelIncompatible, match=r"'clef'.*b11371"):
        read_decision_file(derived["clef"])


class AddedTokenEngine(FakeEngine):
    """As llama.cpp tokenizes a vocabulary with user-defined added tokens: their text becomes the token (300, 301)
    whether special texts are parsed or not (llama-vocab.cpp, tokenizer_st_partition)."""

    user_defined_texts = ("<tool_call>", "</tool_call>")

    def tokenize(self, text: str, *, special: bool = False, bos: bool = False) -> list[int]:
        out, i = [], 0
        while i < len(text):
            hit = next((n for n, t in enumerate(self.user_defined_texts) if text.startswith(t, i)), None)
            if hit is None:
                control = next((c for c in CONTROL if special and text.startswith(c, i)), None)
                out.extend(super().tokenize(control or text[i], special=special))
                i += len(control or text[i])
            else:
                out.append(300 + hit)
                i += len(self.user_defined_texts[hit])
        return out


# A systemone template whose own text holds a user-defined added token's text: it stays the token.
ADDED_TOKEN_TEMPLATE = ("<|im_start|>system\nAnswer with a letter; never emit </tool_call>.<|im_end|>\n"
                        "<|im_start|>user\n{{ instructions }}\n{{ state | tojson }}\n"
                        "{% for o in options %}{{ 'ABCDEFGH'[loop.index0] }}. {{ o.key }}: {{ o.description }}\n"
                        "{% endfor %}<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("value", ["<tool_call>", "x </tool_call> y", "<tool_call></tool_call>",
                                   "<tool_call</tool_call>>", "\ufdd0\ufdd1<tool_call>",
                                   "".join(map(chr, range(0xFDD0, 0xFDF0))) + "<tool_call>", "no added token"])
def test_a_user_defined_added_tokens_text_in_a_requests_values_is_read_as_text(tmp_path, value):
    """In the state (a key and a value), the instructions and an option, the text is tokenized as text, never as the
    token, which llama-server would make it; the template's own occurrence keeps its token; the prompt's text is the
    template's rendering unchanged. Marks the request holds are not used; one that holds all 32 is tokenized as
    llama-server does."""
    engine = AddedTokenEngine(tmp_path / "fake.gguf")
    assert engine.tokenize("a<tool_call>", special=False) == [97, 300], "the fake makes the token of its text"
    rules = LetterRules("openjev", tuple("ABCDEFGH"))
    preparer = LetterPreparer(engine, engine, rules, SystemOneTemplate(ADDED_TOKEN_TEMPLATE), Limits(4000, 20000),
                              CONTROL)
    source = QuestionSource("q", "choice", f"Which? {value}", {value: [value, 1]}, ((value, value), ("no", None)))
    question = Question(("q",), json.dumps(source.state), source.instructions, (value, "no"), (("q", "0"), ("q", "1")),
                        ("state",), ("q",), kind="choice", source=source)
    prepared = preparer.prepare([question])
    [tokens] = prepared.tokens
    text = SystemOneTemplate(ADDED_TOKEN_TEMPLATE).render(render_values(rules, question, shown_options(rules, question)))
    assert b"".join(engine.piece(t) if t < 300 else engine.user_defined_texts[t - 300].encode()
                    for t in tokens) == text.encode(), "the same text"
    if "\ufdef" in value:  # every mark is taken: no occurrence can be told apart, so all five are tokens
        assert tokens.count(300) == 5 and tokens.count(301) == 1
    else:
        assert 300 not in tokens and tokens.count(301) == 1, "only the template's own occurrence is the token"
