"""The engine: llama.cpp and tokens.

Owns the model, the context and the vocabulary (``core``), the pure plan of a scoring job (``plan``), the only
``llama_decode`` caller (``executor``), the KV memory (``memory``), the cross-request state cache (``cache``), the
readout types and math (``readout``), the scheduler thread that owns the context (``scheduler``) and the engine's
exceptions (``errors``). It works in token ids: it knows nothing of prompts, protocols or HTTP.

Importing this package loads nothing native: only ``core``, ``executor`` and ``memory`` import ``llama_cpp``,
so the layers above can use the plan, the readout and the scheduler without the native library.

may import from the package: nothing outside engine/
never imports: flask, werkzeug, gunicorn
"""
