"""rl_dqn: distributed DQN for Atari over PyTorch RPC."""
