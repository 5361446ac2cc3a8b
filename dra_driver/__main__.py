"""``python -m dra_driver`` is the same as the ``gpuready`` command."""

import sys

from dra_driver.cli import main

sys.exit(main())
