import sys

from examples.support_agent.scenario import main

sys.exit(main())
