"""The engine: llama.cpp and tokens.

Owns the model and its context (``llama_model``), the vocabulary (``vocabulary``), everything that decodes on the
context (``runner``: the resident head and jobs step by step), composed with the front of the cache by ``core``
(``Engine``); the pure plan of a scoring job (``plan``) and what it will decode given the cache (``outlook``), the
only ``llama_decode`` caller (``executor``), the KV memory (``memory``), the cross-request state cache
(``cache``), the readout types and math (``readout``), the CPU kernels (``backends``, ``cpu_variants``), the
scheduler thread that owns the context (``scheduler``) and the engine's exceptions (``errors``). It works in
token ids: it knows nothing of prompts, protocols or HTTP.

Importing this package loads nothing native: only ``llama_model``, ``vocabulary``, ``executor``, ``memory`` and
``backends`` import ``llama_cpp`` (and ``core`` and ``runner`` through them), so the layers above can use the
plan, the readout and the scheduler without the native library.

may import from the package: nothing outside engine/
never imports: flask, werkzeug, gunicorn
"""
