from rl_dqn.cli import entry

entry()
