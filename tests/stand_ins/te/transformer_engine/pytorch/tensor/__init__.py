"""TE's `QuantizedTensor` base class (`transformer_engine/pytorch/quantized_tensor.py`, re-exported by
`transformer_engine.pytorch.tensor`): megatron imports it at load to recognise FP8 parameters with `isinstance`.
Modelled: the class exists and no tensor here is one (the stand-in has no FP8). Not modelled: any quantized data."""
import torch


class QuantizedTensor(torch.Tensor):
    def __new__(cls, *args, **kwargs):
        raise NotImplementedError("the TE stand-in models no quantized tensors")
