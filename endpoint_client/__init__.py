"""Operator commands for the deployed endpoints: ``python -m endpoint_client ...``.

- invoke (the default): sends a request file to an endpoint (``--endpoint-name NAME --file F``); ``invoke`` owns
  the retry policy (capped exponential backoff with full jitter on 503, throttling and other transient answers),
  ``cli`` owns arguments, exit codes and output;
- ``check-pins -c env=NAME [--protect]`` (``pins``): every digest and model key cdk.json pins exists, and pinned
  images are protected from the repository's lifecycle rules;
- ``preflight -c env=NAME`` (``preflight``): before a deploy, the pins, the Service Quotas the largest fleet and its
  update need, and no instance-type change under registered auto scaling;
- ``transform -c env=NAME --endpoint cpu --input s3://...`` (``transform``): a Batch Transform job on an endpoint
  stack's model, waited for.

``deployment`` is what the last two share: cdk.json read with the CDK app's own validation, and stack outputs.
"""
