"""``python -m tideflow.cli``: the ``tideflow`` command."""

import sys

from tideflow.cli import main

sys.exit(main())
