import sys

from rl_dqn.cli import main

sys.exit(main())
