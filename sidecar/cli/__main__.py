"""`python -m sidecar.cli`: the `toolauthz` command."""

import sys

from sidecar.cli.main import main

sys.exit(main())
