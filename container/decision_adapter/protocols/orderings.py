"""How many orderings of the options an answer averaged, and why fewer than the server's default where it did: the
``orderings`` of a decision result, the ``x_orderings`` of a System One answer, and of each question of a dry run.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..decisions.model import Scored


def answered_orderings(scored: Scored) -> dict[str, Any]:
    """A scored question's ``Orderings``."""
    return {"averaged": scored.orderings, **({"fewer": scored.fewer_orderings} if scored.fewer_orderings else {})}


class Orderings(BaseModel):
    """The orderings of the options the answer averaged (a decision GGUF's: its type's variants, or those asked)."""

    model_config = ConfigDict(extra="forbid")

    averaged: int = Field(description="How many orderings were read and averaged.")
    fewer: str | None = Field(None, description="Why fewer than the server's default (ADAPTER_PERMUTATIONS) were: "
                                                "the default would have taken the request over its token budget or "
                                                "what a request may take here; the largest number that fits was "
                                                "used.")
