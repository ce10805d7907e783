"""The server: HTTP.

Owns the Flask app factory (``app``), the adapter's state and its model loader (``state``), the gate before a
scoring request (``gate``: API key, readiness, admission by count), bodies read within their limits
(``bodies``), the one error classifier (``errors``), the scoring call a protocol answer uses (``calls``), one
blueprint per protocol (``sagemaker``, ``systemone``), JSON logs (``logs``), gunicorn (``serve``; its worker, which stamps each request's arrival: ``worker``) and
``make run`` (``local``). The only code that imports flask, werkzeug or gunicorn.

may import from the package: engine, decisions, protocols, settings, startup, errors, metric_logs
never imports: llama_cpp
"""
