import sys

from examples.openai_agents_agent.agent import main

sys.exit(main())
