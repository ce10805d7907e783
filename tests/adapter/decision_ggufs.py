"""Decision GGUFs derived from the embedded model (SmolLM2-135M) for the tests: ``benchmarks.decision_gguf`` derives
them (its tensors and metadata copied, plus ``<arch>.decision.type``, a ``tokenizer.chat_template.systemone``
template, fitted-looking temperatures and, for a head type, the head's extra tensor). The weights are a chat
model's, not a decision model's: the derived models answer at about chance; they test the rules, not accuracy."""

from benchmarks.decision_gguf import (LEV_TEMPLATE, OPENJEV_TEMPLATE, TEMPERATURES, TEMPLATES, derive,  # noqa: F401
                                      derive_head, derive_type)
