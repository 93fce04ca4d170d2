"""TE's `GroupedLinear` (MoE experts), which megatron subclasses at import when TE >= 1.9. Not modelled: refused."""
import torch


class GroupedLinear(torch.nn.Module):
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("the TE stand-in models no GroupedLinear (mixture of experts)")
