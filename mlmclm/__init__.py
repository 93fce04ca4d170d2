from mlmclm import megatron_jit

megatron_jit.install()
