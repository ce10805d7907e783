"""The model's vocabulary: text to tokens and back, and what the special tokens spell.

Read once from a loaded ``LlamaModel``: whether prompts start with BOS, the texts of BOS, EOS and every control
token (a template's own text may hold them; user text never becomes them), and for each byte value the most bytes
a token holding it spells (which bounds how few tokens a text can be before it is tokenized: ``fewest_tokens``). Any thread may tokenize; a closed model
refuses with ``ScoringFailed``.
"""

from __future__ import annotations

import ctypes
import math
from collections import Counter

import llama_cpp as llama

from .errors import ScoringFailed
from .llama_model import LlamaModel


class Vocabulary:
    def __init__(self, model: LlamaModel):
        self._model = model
        self._vocab = model.vocab
        self.n_vocab = model.n_vocab
        self.add_bos = bool(llama.llama_vocab_get_add_bos(self._vocab))
        self.bos_text = self._special_text(llama.llama_vocab_bos(self._vocab))
        self.eos_text = self._special_text(llama.llama_vocab_eos(self._vocab))
        self.control_texts, self._reach = self._read_specials()
        # The texts of user-defined added tokens (LLAMA_TOKEN_ATTR_USER_DEFINED; Qwen2.5's <tool_call>): llama.cpp
        # splits them out of any text, special texts parsed or not (llama-vocab.cpp, tokenizer_st_partition), so
        # user text that holds one is tokenized in pieces by its callers (decisions.prepare.text_tokens).
        self.user_defined_texts = tuple(sorted(
            {self.piece(t).decode("utf-8", "replace") for t in range(self.n_vocab)
             if llama.llama_vocab_get_attr(self._vocab, t) & llama.LLAMA_TOKEN_ATTR_USER_DEFINED} - {""}))
        self.max_piece_bytes = max(self._reach)

    def fewest_tokens(self, text: str) -> int:
        """A lower bound on the tokens of ``text`` however it is tokenized, from its bytes alone (linear, no
        tokenizing): a token that covers byte b spells at most ``reach[b]`` bytes, so each byte is at least
        1/reach[b] of a token. Tighter than bytes / longest piece: a vocabulary's longest pieces are runs of white
        space or punctuation (SmolLM2: 81 bytes), while a token holding a letter spells at most 25."""
        counts = Counter(text.encode("utf-8"))
        return math.ceil(math.fsum(n / self._reach[b] for b, n in counts.items()) - 1e-6)

    def tokenize(self, text: str, *, special: bool = False, bos: bool = False) -> list[int]:
        """Tokens of ``text``. ``special``: the texts of special tokens are parsed as those tokens (for the
        template's own text; user text is tokenized as text). ``bos``: the start of a whole prompt, which gets
        BOS where the model asks for it (unless the text starts with it)."""
        self._require_open()
        data = text.encode("utf-8")
        add_bos = bos and self.add_bos and not (special and self.bos_text and text.startswith(self.bos_text))
        capacity = len(data) + 8
        while True:
            out = (llama.llama_token * capacity)()
            n = llama.llama_tokenize(self._vocab, data, len(data), out, capacity, add_bos, special)
            if n >= 0:
                return list(out[:n])
            capacity = -n

    def piece(self, token: int) -> bytes:
        self._require_open()
        buf = ctypes.create_string_buffer(64)
        n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        return buf.raw[:n]  # the buffer is padded; only the first n bytes are the piece

    def _require_open(self) -> None:
        if self._model.closed:
            raise ScoringFailed("the engine is closed")

    def _special_text(self, token: int) -> str:
        return self.piece(token).decode("utf-8", "replace") if token >= 0 else ""

    def _read_specials(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The texts of the vocabulary's special tokens (control and unknown: in a template they are parsed as
        such; in user text they are refused), and for each byte value the most bytes a token holding it spells
        (every token, special ones too: a template's text is tokenized with them; 1 for a byte no token holds)."""
        texts = set()
        special_ids = {llama.llama_vocab_bos(self._vocab), llama.llama_vocab_eos(self._vocab),
                       llama.llama_vocab_eot(self._vocab)}
        special = llama.LLAMA_TOKEN_ATTR_CONTROL | llama.LLAMA_TOKEN_ATTR_UNKNOWN
        reach = [1] * 256
        for token in range(self.n_vocab):
            piece = self.piece(token)
            if token in special_ids or llama.llama_vocab_get_attr(self._vocab, token) & special:
                text = piece.decode("utf-8", "replace")
                if text.strip():
                    texts.add(text)
            for byte in set(piece):
                reach[byte] = max(reach[byte], len(piece))
        return tuple(sorted(texts, key=lambda t: (-len(t), t))), tuple(reach)
