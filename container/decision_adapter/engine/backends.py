"""llama.cpp's compute backends: which CPU kernels this process runs, chosen and loaded before any model.

The CPU build is llama.cpp's release layout (``GGML_BACKEND_DL`` and ``GGML_CPU_ALL_VARIANTS``,
container/llama_wheel.py): each x86-64 CPU variant of ggml's CPU backend (x64, sse42, sandybridge, ..., haswell,
skylakex, icelake, cooperlake, zen4, alderlake, sapphirerapids; the image ships all, a local build the baseline and
the best for its machine) is its own library ``libggml-cpu-<variant>.so`` beside ``libllama.so``. ggml scores each
against the CPU it runs on (``ggml_backend_score``: 0 where an instruction it was compiled for is missing);
``load`` loads the best of those the operating system also enables (``choose``, ``cpu_variants``). llama-cpp-python
binds none of this, and ``llama_backend_init`` would only search the Python executable's folder and the working
directory, so ``load`` calls ggml through ctypes with the folder the loaded ``libllama`` came from, before the
first model loads.

``ADAPTER_CPU_VARIANT`` may name one variant instead of ``auto`` (the same kernels, so the same answers bit for bit,
on every instance of a mixed fleet); ggml refuses it on a CPU that lacks its instructions. A build whose CPU backend
is linked in (the GPU image, any build without ``GGML_BACKEND_DL``) reports the variant ``built-in``. Whatever
cannot be loaded raises ``BackendUnavailable`` with the reason; nothing here may crash the process.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as llama

from . import cpu_variants
from .errors import BackendUnavailable

log = logging.getLogger(__name__)

VARIANT_FILE = re.compile(r"^libggml-cpu-(?P<variant>.+)\.so$")
BUILT_IN = "built-in"


@dataclass(frozen=True)
class Kernels:
    """The CPU backend this process loaded: its variant, the instruction sets it was compiled for (ggml's
    feature names: AVX2, AVX512, AVX512_VNNI, AVX512_BF16, AMX_INT8, ...), its file, the CPU, every backend."""

    variant: str
    features: tuple[str, ...]
    library: str
    cpu: str
    backends: tuple[str, ...]

    def info(self) -> dict[str, object]:
        """What a result's ``model`` and ``/ping`` say about the kernels."""
        return {"cpu_variant": self.variant, "cpu_features": list(self.features)}


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


class _Feature(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


_libdl = ctypes.CDLL("libdl.so.2")  # dlopen, dlsym, dladdr (in libc itself since glibc 2.34; the stub forwards)
_libdl.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
_libdl.dladdr.restype = ctypes.c_int
_libdl.dlopen.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libdl.dlopen.restype = ctypes.c_void_p
_libdl.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_libdl.dlsym.restype = ctypes.c_void_p
_libdl.dlclose.argtypes = [ctypes.c_void_p]
_libdl.dlerror.restype = ctypes.c_char_p
RTLD_NOW, RTLD_LOCAL = 2, 0
_SCORE = ctypes.CFUNCTYPE(ctypes.c_int)
_FEATURES = ctypes.CFUNCTYPE(ctypes.POINTER(_Feature), ctypes.c_void_p)

_lock = threading.Lock()
_loaded: Kernels | None = None


def library_of(address: int) -> Path:
    """The shared library that holds ``address``, as the dynamic loader recorded it."""
    info = _DlInfo()
    if not _libdl.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        raise BackendUnavailable(f"the dynamic loader knows no library at {address:#x}")
    return Path(os.fsdecode(info.dli_fname))


def _ggml() -> tuple[ctypes.CDLL, Path]:
    """ggml's registry functions, looked up through the libllama that llama-cpp-python loaded (so through the very
    libggml it links, never a second copy), and the folder that libllama lies in."""
    libllama = library_of(ctypes.cast(llama.llama_backend_init, ctypes.c_void_p).value)
    lib = ctypes.CDLL(str(libllama))  # already loaded under this name: the same handle
    signatures = {
        "ggml_backend_load": ([ctypes.c_char_p], ctypes.c_void_p),
        "ggml_backend_reg_count": ([], ctypes.c_size_t),
        "ggml_backend_reg_get": ([ctypes.c_size_t], ctypes.c_void_p),
        "ggml_backend_reg_by_name": ([ctypes.c_char_p], ctypes.c_void_p),
        "ggml_backend_reg_name": ([ctypes.c_void_p], ctypes.c_char_p),
        "ggml_backend_reg_get_proc_address": ([ctypes.c_void_p, ctypes.c_char_p], ctypes.c_void_p),
        "ggml_backend_reg_dev_count": ([ctypes.c_void_p], ctypes.c_size_t),
        "ggml_backend_reg_dev_get": ([ctypes.c_void_p, ctypes.c_size_t], ctypes.c_void_p),
        "ggml_backend_dev_description": ([ctypes.c_void_p], ctypes.c_char_p),
    }
    for name, (argtypes, restype) in signatures.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, restype
    return lib, libllama.parent


def variant_files(folder: Path) -> dict[str, Path]:
    """The CPU variants a build ships in ``folder``, by name."""
    found = {}
    for path in sorted(folder.glob("libggml-cpu-*.so")):
        match = VARIANT_FILE.match(path.name)
        if match:
            found[match["variant"]] = path
    return found


def probe(path: Path) -> int:
    """ggml's score of a variant library on this CPU (0: it needs instructions the CPU lacks); raises
    ``BackendUnavailable`` with the loader's reason where the file cannot be loaded at all."""
    handle = _libdl.dlopen(os.fsencode(path), RTLD_NOW | RTLD_LOCAL)
    if not handle:
        reason = (_libdl.dlerror() or b"unknown error").decode("utf-8", "replace")
        raise BackendUnavailable(f"llama.cpp's CPU backend {path} cannot be loaded: {reason}")
    try:
        score = _libdl.dlsym(handle, b"ggml_backend_score")
        if not score:
            raise BackendUnavailable(f"llama.cpp's CPU backend {path} has no ggml_backend_score: not a ggml backend")
        return _SCORE(score)()
    finally:
        _libdl.dlclose(handle)


def load(variant: str = "auto") -> Kernels:
    """Load the CPU backend once per process: the best variant for this CPU (``auto``) or the one named; then
    describe it. A second call returns the first's result,
    and refuses a different variant (ggml cannot swap the kernels under a loaded model)."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load(variant)
            log.info("llama.cpp CPU kernels: variant %s (%s) from %s on %s; backends %s", _loaded.variant,
                     " ".join(_loaded.features), _loaded.library, _loaded.cpu, ", ".join(_loaded.backends))
        elif variant not in ("auto", _loaded.variant):
            raise BackendUnavailable(f"this process already runs llama.cpp's CPU variant {_loaded.variant}; "
                                     f"it cannot switch to {variant}")
        return _loaded


def _load(variant: str) -> Kernels:
    ggml, folder = _ggml()
    if ggml.ggml_backend_reg_by_name(b"CPU"):  # linked in (no GGML_BACKEND_DL), or loaded by someone before us
        if variant != "auto":
            raise BackendUnavailable(f"ADAPTER_CPU_VARIANT={variant}, but this llama.cpp build's CPU backend is "
                                     f"built in (no CPU variants to choose from); set it to auto")
        return _describe(ggml)
    files = variant_files(folder)
    if not files:
        raise BackendUnavailable(f"no CPU backend in {folder}: llama.cpp's variants (libggml-cpu-<variant>.so) are "
                                 f"missing; rebuild llama-cpp-python with -DGGML_BACKEND_DL=ON "
                                 f"-DGGML_CPU_ALL_VARIANTS=ON (container/llama_wheel.py)")
    # ggml skips a variant it cannot load, and would run a weaker one without a word: a damaged install fails here.
    scores = {name: probe(path) for name, path in files.items()}
    chosen = choose(variant, scores, cpu_variants.cpu_flags(), folder)
    if not ggml.ggml_backend_load(os.fsencode(files[chosen])):
        raise BackendUnavailable(f"llama.cpp refused its CPU backend {files[chosen]}")
    if not ggml.ggml_backend_reg_by_name(b"CPU"):
        raise BackendUnavailable(f"llama.cpp's CPU backend {files[chosen]} registered no CPU device")
    return _describe(ggml)


def choose(variant: str, scores: dict[str, int], flags: frozenset[str] | None, folder: Path) -> str:
    """The variant to load: the one named, or (``auto``) the best by ggml's score among those this CPU runs.

    ggml's score reads CPUID alone; a variant whose instructions the operating system does not enable (AVX-512
    state off in XCR0: Linux then lists no avx512 flag in /proc/cpuinfo) scores as runnable there and dies of
    SIGILL at its first kernel, so the kernel's flags (``flags``; None where unknown) rule such a variant out.
    ``auto`` never picks an AMX variant (``cpu_variants.AMX_FEATURES``). Variants this module does not know
    (``cpu_variants.VARIANTS``) are taken at ggml's word."""
    def os_refuses(name: str) -> bool:
        return flags is not None and name in cpu_variants.VARIANTS and not cpu_variants.runs(name, flags)

    if variant != "auto":
        if variant not in scores:
            raise BackendUnavailable(f"ADAPTER_CPU_VARIANT={variant} names no CPU variant of this build; it has "
                                     f"{', '.join(scores)} (or auto)")
        if scores[variant] == 0 or os_refuses(variant):
            why = "this CPU lacks" if scores[variant] == 0 else "the operating system does not enable"
            raise BackendUnavailable(f"ADAPTER_CPU_VARIANT={variant}: {why} instructions that llama.cpp's "
                                     f"{variant} kernels need; variants this CPU runs: "
                                     f"{', '.join(n for n, s in scores.items() if s and not os_refuses(n)) or 'none'}"
                                     f" (or auto)")
        return variant
    # AMX variants only by name (cpu_variants.AMX_FEATURES: they died of SIGILL where the OS enables AMX).
    runnable = {name: score for name, score in scores.items()
                if score > 0 and not os_refuses(name) and not (name in cpu_variants.VARIANTS
                                                               and cpu_variants.uses_amx(name))}
    if not runnable:
        refused = [n for n, s in scores.items() if s > 0]
        raise BackendUnavailable(f"no CPU variant in {folder} runs on this CPU (scores: "
                                 f"{', '.join(f'{n}={s}' for n, s in scores.items())}"
                                 + (f"; the operating system enables the instructions of none of "
                                    f"{', '.join(refused)}" if refused else "") + ")")
    return max(runnable, key=runnable.__getitem__)


def _describe(ggml: ctypes.CDLL) -> Kernels:
    reg = ggml.ggml_backend_reg_by_name(b"CPU")
    address = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_get_features")
    features = []
    if address:
        feature = _FEATURES(address)(reg)
        i = 0
        while feature[i].name:
            name, value = feature[i].name.decode(), feature[i].value.decode()
            features.append(name if value == "1" else f"{name}={value}")
            i += 1
    library = library_of(address) if address else Path("unknown")
    match = VARIANT_FILE.match(library.name)
    cpu = (ggml.ggml_backend_dev_description(ggml.ggml_backend_reg_dev_get(reg, 0)) or b"").decode("utf-8", "replace")
    backends = tuple(ggml.ggml_backend_reg_name(ggml.ggml_backend_reg_get(i)).decode()
                     for i in range(ggml.ggml_backend_reg_count()))
    return Kernels(variant=match["variant"] if match else BUILT_IN, features=tuple(features), library=library.name,
                   cpu=cpu.strip(), backends=backends)
