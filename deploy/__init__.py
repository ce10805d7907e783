"""Tooling around the CDK app that runs without AWS: ``make diff`` (``deploy.diff``), ``make rehearse``
(``deploy.rehearse``) and the real-format pins both use (``deploy.pins``)."""
