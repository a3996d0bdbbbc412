"""A revision names one exact pod: the hash of the rendered pod template, so any change that
changes the pod (model, image, args, resources, probes, ...) is a new revision and nothing else is."""

from __future__ import annotations

import hashlib
import json
from typing import Any

REVISION_LENGTH = 10


def revision_of(pod_template: dict[str, Any]) -> str:
    """Stable across processes and dict orderings; hex, so it is a valid name suffix and label value."""
    canonical = json.dumps(pod_template, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:REVISION_LENGTH]
