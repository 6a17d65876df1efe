"""`python -m toolauthz.cli`: the `toolauthz` command."""

import sys

from toolauthz.cli.entry import main  # SIGHUP deferred before the heavy imports

sys.exit(main())
