"""Progress of long transfers on stderr: a tqdm bar on a terminal, one plain line per tenth otherwise.

Build logs (CodeBuild, CI) are not terminals; a redrawn bar there becomes thousands of lines, while a
silent multi-minute download looks hung. Hence the plain lines.
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

from tqdm import tqdm

_MEBIBYTE = 1024 * 1024


class Progress:
    """Counts bytes towards a known total. `advance` may be called from several threads (boto3 does)."""

    def __init__(self, label: str, total: int, already_done: int = 0, stream: TextIO | None = None):
        self._stream = stream or sys.stderr
        self._label = label
        self._total = total
        self._done = already_done
        self._lock = threading.Lock()
        self._bar = None
        if self._stream.isatty():
            self._bar = tqdm(total=total, initial=already_done, desc=label, unit="B", unit_scale=True,
                             unit_divisor=1024, file=self._stream)
        self._next_tenth = self._tenths_done() + 1

    def advance(self, byte_count: int) -> None:
        with self._lock:
            self._done += byte_count
            if self._bar is not None:
                self._bar.update(byte_count)
                return
            if self._tenths_done() >= self._next_tenth:
                self._next_tenth = self._tenths_done() + 1
                print(f"{self._label}: {self._done // _MEBIBYTE} of {self._total // _MEBIBYTE} MiB "
                      f"({100 * self._done // max(self._total, 1)}%)", file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _tenths_done(self) -> int:
        return 10 * self._done // max(self._total, 1)
