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
    """llama.cpp refused a saved sequence; the job is decoded again from the head."""


class PlanError(ValueError):
    """The job cannot be laid out within the limits; the message gives the numbers."""


class Busy(RuntimeError):
    """The queue holds as much work as it may; retry later."""


class TooSlow(Busy):
    """The job's work, after the work ahead of it, cannot be done before its deadline at the measured speed."""


class DeadlineExceeded(RuntimeError):
    """The job was not answered within its deadline; its work was dropped."""


class ScoringFailed(RuntimeError):
    """The job failed inside the engine; the traceback is in the log."""
