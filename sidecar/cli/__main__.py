"""`python -m sidecar.cli`: the `toolauthz` command."""

import sys

from sidecar.cli.entry import main  # SIGHUP deferred before the heavy imports

sys.exit(main())
