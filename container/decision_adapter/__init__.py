"""The decision adapter: a GGUF model served as a decision model (option probabilities from logits).

Four layers, each a sub-package whose docstring says what it owns and what it may import; a test
(tests/adapter/test_adapter_import_rules.py) reads the ``may import`` and ``never imports`` lines below and in
each layer's docstring and fails on any import that breaks them, or on any import circle:

- ``engine/``: llama.cpp and tokens (the only code that imports ``llama_cpp``);
- ``decisions/``: text to tokens to probabilities (prompt, labels, calibration, model files, the decision model);
- ``protocols/``: the wire formats (request and response models, answers, dispatch, the OpenAPI document);
- ``server/``: HTTP (the only code that imports flask, werkzeug or gunicorn).

At the top stay what spans the layers, each module with rule lines of its own: ``errors`` (the errors that reach
clients) and ``metric_logs`` (the log lines CloudWatch metrics read) below everything; ``settings`` (every knob,
read once from the environment) and ``startup`` (engine, scheduler and decision model built and probed), the
composition root; ``calibrate``, the entry point that fits calibration.json.

This file itself:
may import from the package: nothing
never imports: flask, werkzeug, gunicorn, llama_cpp
"""
