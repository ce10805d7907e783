"""The adapter's state behind the app: its settings, the model's readiness, admission (with the large
bodies' turns), and the model loader.

``current()`` is the state of the app handling the request; the loader thread sets the readiness once, and
``/ping`` only reads it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from flask import current_app

from ..settings import Settings
from ..startup import Readiness, load_into
from .admission import Admission, LargeBodyTurns

EXTENSION = "decision_adapter"


@dataclass
class AdapterState:
    settings: Settings
    readiness: Readiness
    admission: Admission
    engine: Any = None  # an engine handed in (tests); None: the loader builds the real one
    loader: threading.Thread | None = field(default=None, repr=False)
    turns: LargeBodyTurns = field(default_factory=LargeBodyTurns)  # one large body parsed at a time

    @property
    def in_transform(self) -> bool:
        """Whether this container serves a Batch Transform job: the deployment says so (ADAPTER_DEPLOYMENT, or
        SAGEMAKER_BATCH, which SageMaker sets in every transform container); no request can make it one."""
        return self.settings.deployment == "transform"

    def close(self) -> None:
        """Wait for the loader, then stop the model's scheduler and free what the loader loaded (an engine handed
        in stays its owner's). A process that exits needs none of this; a test that builds apps does."""
        if self.loader is not None:
            self.loader.join()
        if self.readiness.model is not None:
            self.readiness.model.close()

    def start_loading(self) -> None:
        """Load in the background (once); /ping stays 503 until the model is ready."""
        if self.loader is None:
            self.loader = threading.Thread(target=load_into, args=(self.readiness, self.settings, self.engine),
                                           name="model-loader", daemon=True)
            self.loader.start()


def current() -> AdapterState:
    return current_app.extensions[EXTENSION]
