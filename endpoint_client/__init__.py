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

- ``acceptance -c env=NAME`` (``acceptance``): after a deploy, the checks only a real account can make: each
  endpoint answers, its log line and log metric, every alarm's metric, storage, alarm delivery, and on request a
  rollback drill; every run writes its report (``acceptance_report``: what each endpoint served, and whether every
  check passed) to the artifact bucket's ``acceptance/<environment>/``;
- ``promote --from dev --to prod`` (``promote``): writes the target's pins in cdk.json from what the source's
  endpoints serve, refusing unless the source's latest acceptance report passed for exactly those digests.
- ``capture -c env=NAME --kind cpu --since 2h [--format table|jsonl]`` (``capture``): the decisions the endpoint's
  data capture recorded in a time window (request id, SageMaker's event id, options, the chosen option and its
  probability), read back from the artifact bucket.

``deployment`` is what the operator commands share: cdk.json read with the CDK app's own validation, stack outputs,
and what an endpoint serves.
"""
