"""``python -m eglcuda``: see :mod:`eglcuda.cli`."""
import sys

from .cli import main

sys.exit(main())
