"""`python -m keelway.router`: run the router process."""

import sys

from keelway.router.server import main

sys.exit(main())
