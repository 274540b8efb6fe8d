"""`python -m cli` is `diffq`."""

import sys

from cli import main

sys.exit(main())
