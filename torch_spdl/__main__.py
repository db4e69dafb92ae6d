"""``python -m torch_spdl COMMAND``: the same as the ``torch-spdl`` command."""

import sys

from ._cli import main

sys.exit(main())
