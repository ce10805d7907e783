"""Invokes a SageMaker endpoint with a request file: ``python -m endpoint_client --endpoint-name NAME --file F``.

``invoke`` owns the retry policy (capped exponential backoff with full jitter on 503, throttling and other
transient answers); ``cli`` owns arguments, exit codes and output.
"""
