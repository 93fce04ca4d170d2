"""Training: config tree, megatron-core step, phases, checkpoints, logging. Entry: `pretrain(config)`."""
