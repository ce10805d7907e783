"""Answer labels: which strings label the options, for each number of options.

Up to 26 options are labelled ``A``..``Z``, each a single token in the tokenizers we serve. More options
are labelled ``A0``..``Z9`` (up to 260), so that no label is a prefix of another: their probabilities
come from the chain rule over the label's tokens.
"""

from __future__ import annotations

import string

SINGLE = tuple(string.ascii_uppercase)
PAIRED = tuple(f"{letter}{digit}" for letter in string.ascii_uppercase for digit in string.digits)
MAX_OPTIONS = 255
MAX_PERMUTATIONS = 16  # orderings one question may be averaged over (the cost is that many prompts)
# System One's question types; a calibration has one temperature per type, and score levels may take digits.
QUESTION_TYPES = ("noul", "choice", "score")


def labels_for(n_options: int) -> tuple[str, ...]:
    if not 1 <= n_options <= len(PAIRED):
        raise ValueError(f"no label set for {n_options} options")
    return SINGLE[:n_options] if n_options <= len(SINGLE) else PAIRED[:n_options]
