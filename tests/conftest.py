"""Put ``tests/`` on ``sys.path`` so that test modules in sub-folders share its helpers (``toy``, ``_dist``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
