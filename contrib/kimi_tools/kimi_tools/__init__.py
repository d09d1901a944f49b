"""kimi.k2's checkout tools: kimi-bundle (the air-gapped bundle builder: kimi_bundle_cli, kimi_bundle_build,
kimi_bundle_apt, kimi_bundle_wheels, kimi_bundle_hf), kimi-advisories (kimi_advisories_refresh), kimi-gpu-facts
(kimi_gpu_facts) and kimi-plan (kimi_plan_cli).

They run from a checkout (bin/kimi-* or an editable install of contrib/kimi_tools) and import the collection's
module_utils the one way the collection's own plugins do, as ansible_collections.kimi.k2.plugins.module_utils.*.
The checkout's collections/ directory (ansible_collections/kimi/k2/{plugins,meta} are links into the checkout)
goes first on sys.path here, before any tool module is imported: the tools read this checkout's playbooks and
roles, so the module_utils they use must be this checkout's too, never another installed copy of kimi.k2.
"""

from __future__ import annotations

import sys
from pathlib import Path

# contrib/kimi_tools/kimi_tools/__init__.py: the checkout is three directories up.
CHECKOUT = Path(__file__).resolve().parents[3]

_COLLECTIONS = CHECKOUT / "collections"
if _COLLECTIONS.is_dir() and str(_COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(_COLLECTIONS))
