"""Protocols: the wire formats.

Owns the request and response models of the AWS walkthrough's decision schema (``decision_schema``) and of
TypeSafe's System One (``systemone``), the field types they share (``fields``), the call context an answer is
computed in and the dispatch of a body to its protocol (``dispatch``), and the OpenAPI document (``openapi``).
An answer function takes a ``Call`` (the decision model, a scoring function, the start time) and returns the
payload, headers and log fields; each protocol renders its own error body from a ``Failure``. Nothing here
knows HTTP frameworks or llama.cpp.

may import from the package: decisions, errors
never imports: flask, werkzeug, gunicorn, llama_cpp
"""
