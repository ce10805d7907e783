"""How an endpoint is updated, and how many instances an update needs: plain rules, no CDK.

The endpoint stacks build their DeploymentConfig from :func:`plan` (stacks/endpoint_specs.py), and
``python -m endpoint_client preflight`` sizes the Service Quotas an update needs from the same rules.

Blue/green provisions a whole second fleet as large as the current one before it shifts any traffic (all at once,
or a one-instance canary first when the fleet has two or more), so an update needs twice the fleet. Rolling
replaces the fleet in batches of 50 % (SageMaker allows 5 to 50 %), so it needs half the fleet more; the GPU variant
rolls when it has at least two instances (GPU capacity and quota are scarce), else a batch would be the whole fleet.
The fleet an update starts from is whatever auto scaling reached (RetainAllVariantProperties), at most
``max_instance_count``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class UpdatePlan:
    strategy: Literal["blue_green", "rolling"]
    traffic: Literal["ALL_AT_ONCE", "CANARY"] | None     # blue/green only
    batch_percent: int | None = None                      # rolling only

    def extra_instances(self, fleet: int) -> int:
        """Instances beyond the fleet that the update provisions at its peak."""
        if self.strategy == "rolling":
            return math.ceil(fleet * self.batch_percent / 100)
        return fleet


ROLLING_BATCH_PERCENT = 50


def plan(*, scarce_capacity: bool, initial_instance_count: int) -> UpdatePlan:
    """The update strategy of a variant whose fleet never has fewer than initial_instance_count instances."""
    if scarce_capacity and initial_instance_count >= 2:
        return UpdatePlan("rolling", None, ROLLING_BATCH_PERCENT)
    return UpdatePlan("blue_green", "CANARY" if initial_instance_count >= 2 else "ALL_AT_ONCE")


def peak_instances(*, max_instance_count: int, update: UpdatePlan, scaling_attached: bool,
                   initial_instance_count: int) -> int:
    """The most instances the endpoint can hold at once: its largest fleet during an update. Without auto scaling
    the fleet stays where it was when scaling was detached, at most max_instance_count."""
    fleet = max_instance_count if scaling_attached else max(max_instance_count, initial_instance_count)
    return fleet + update.extra_instances(fleet)
