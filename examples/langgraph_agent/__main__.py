import sys

from examples.langgraph_agent.agent import main

sys.exit(main())
