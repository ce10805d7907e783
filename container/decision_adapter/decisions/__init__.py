"""Decisions: text to tokens to probabilities.

Owns how a decision becomes a prompt (``prompt``: the GGUF's chat template, the prompt styles), the answer
labels (``labels``), the search for the model's control tokens in request text (``literals``), the model folder
and its pinned identity (``model_files``), calibration bound to a model (``calibration``) and the
``DecisionModel`` (``model``): rendering, token budgets, label checks at load, and the probabilities from the
engine's label log-probabilities. It scores through the engine's scheduler and knows no
wire format and no HTTP.

may import from the package: engine, errors
never imports: flask, werkzeug, gunicorn, llama_cpp
"""
