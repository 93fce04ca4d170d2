"""How every fine-tuned encoder is loaded (`from_pretrained(model_dir, trust_remote_code=False, **load_options())`):
no hub kernels, and PyTorch's SDPA attention without a host read.

- **Attention.** PyTorch's SDPA (on a GPU its flash and memory-efficient kernels: the flash-attention kernels
  built into torch) with the padding mask always passed as a tensor. transformers' own "sdpa" mask builder asks
  `padding_mask.all()` on every forward, to drop the mask of an unpadded batch
  (masking_utils._ignore_bidirectional_mask_sdpa): a host read, so on a GPU every micro-batch would wait for the
  device. "sdpa_no_host_read" is the same attention function and mask builder with that skip off: the mask stays
  on the device and is always applied. On CPU the outputs equal "sdpa"'s bit for bit
  (tests/eval/test_finetune_device.py); on a GPU an unpadded micro-batch then runs the memory-efficient kernel
  rather than the flash one. The `flash_attn` package is not used: transformers' unpadding for it reads the
  longest sequence back to the host on every forward.
- **No hub kernels.** transformers 5 kernelizes a model by default (`use_kernels`): layers replaced by kernels
  fetched from the hub on `model.train()`. That is code from the network (a cluster node has none) and not what
  EncodEval's transformers 4.55 ran; off.
"""
from __future__ import annotations

from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

ATTENTION = "sdpa_no_host_read"


def _mask_without_host_read(*args, **kwargs):
    kwargs["allow_is_bidirectional_skip"] = False  # the skip is the `.all()` host read
    return sdpa_mask(*args, **kwargs)


def load_options() -> dict:
    """`from_pretrained` keywords for an encoder we fine-tune. Registers the attention (idempotent: each worker
    process registers its own)."""
    AttentionInterface.register(ATTENTION, sdpa_attention_forward)
    AttentionMaskInterface.register(ATTENTION, _mask_without_host_read)
    return {"attn_implementation": ATTENTION, "use_kernels": False}
