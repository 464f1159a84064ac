"""``python -m kvckpt_web.cli``: the ``kvckpt`` command."""

import sys

from .main import main

sys.exit(main())
