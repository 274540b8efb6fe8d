"""`python -m app.cli` is `diffq`."""

import sys

from app.cli import main

sys.exit(main())
