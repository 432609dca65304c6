"""Where the public conformance vectors live, for every test that replays them.

``$DBSPARK_CONFORMANCE_VECTORS`` wins; otherwise the shared folder beside this checkout
(``<checkout>/../shared/conformance/vectors``), which is where CI puts it. A missing
folder stops the run at collection: tests parametrized over no vectors would pass
vacuously.
"""

from __future__ import annotations

import os
from pathlib import Path

VECTOR_DIR = Path(
    os.environ.get("DBSPARK_CONFORMANCE_VECTORS")
    or Path(__file__).resolve().parents[2] / "shared" / "conformance" / "vectors"
)
if not sorted(VECTOR_DIR.glob("*.json")):
    raise RuntimeError(
        f"no conformance vectors in {VECTOR_DIR}: put the shared folder beside this "
        "checkout or point DBSPARK_CONFORMANCE_VECTORS at the vectors"
    )
VECTORS = sorted(VECTOR_DIR.glob("*.json"))
