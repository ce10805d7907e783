"""The engine's exceptions, in one place: what loading, planning, decoding and scheduling can raise."""

from __future__ import annotations


class EngineError(RuntimeError):
    """llama.cpp could not load or evaluate; the message says which step failed."""


class BackendUnavailable(EngineError):
    """llama.cpp's CPU kernels could not be loaded (missing, damaged, or not runnable on this CPU); the message
    says which and why."""


class GpuUnavailable(EngineError):
    """GPU layers were requested from a llama.cpp build without a GPU backend."""


class DecodeAborted(EngineError):
    """A ``llama_decode`` was stopped through the abort flag: the job's deadline passed."""


class RestoreFailed(EngineError):
    """llama.cpp refused a saved sequence or a checkpoint; the job is decoded again from the head."""


class CutRefused(RestoreFailed):
    """llama.cpp refused to cut a sequence back: the model's memory is not what its kind says. The job is decoded
    again from the head, without the reuse that needed the cut."""


class PlanError(ValueError):
    """The job cannot be laid out within the limits; the message gives the numbers."""


class Busy(RuntimeError):
    """The queue holds as much work as it may; retry later."""


class TooSlow(Busy):
    """The job's work, after the work ahead of it, cannot be done before its deadline at the measured speed."""


class TooLarge(RuntimeError):
    """A request's own work takes longer than its deadline allows even on an idle server, by a margin the cost
    model's error cannot explain (``cost.CostModel.fastest``): no retry can pass; the request must be split."""

    def __init__(self, tokens: int, needed_s: float, allowed_s: float):
        super().__init__(f"{tokens} tokens need about {needed_s:.0f} s as this server's jobs have run; "
                         f"{allowed_s:.0f} s are allowed")
        self.tokens = tokens
        self.needed_s = needed_s
        self.allowed_s = allowed_s

    @property
    def tokens_per_s(self) -> float:
        """The rate this work would be decoded at, as estimated."""
        return self.tokens / self.needed_s

    @property
    def allowed_tokens(self) -> int:
        """About the most a request of this shape may decode here: what that rate does in the time allowed."""
        return int(self.tokens * self.allowed_s / self.needed_s)


class DeadlineExceeded(RuntimeError):
    """The job was not answered within its deadline; its work was dropped. ``decoded_tokens`` and ``compute_s``
    are what it decoded before it was stopped and the seconds those decodes took (0 for a job that never ran): a
    release too slow for its deadlines is measured on these jobs too (metric_logs)."""

    def __init__(self, message: str, *, decoded_tokens: int = 0, compute_s: float = 0.0):
        super().__init__(message)
        self.decoded_tokens = decoded_tokens
        self.compute_s = compute_s


class ScoringFailed(RuntimeError):
    """The job failed inside the engine; the traceback is in the log."""
