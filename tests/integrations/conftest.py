"""The helpers of ``tests/integrations`` (``launch``, ``netns``, the workers) on ``sys.path``.

The tests of the Trainer wing (``trainer/``) and of live membership
(``elastic/``) sit one folder below the helpers they share with the tests of
the shared modules, as ``tests/conftest.py`` does for ``toy`` and ``_dist``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
