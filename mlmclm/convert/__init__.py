"""Conversion between our megatron dist checkpoints and Hugging Face (EuroBERT / Llama-family) models.

`to_hf.export_checkpoint` / `to_hf.convert_to_hf`: checkpoint (any TP/PP/VPP/DP layout) → HF EuroBERT directory.
`from_hf.convert_from_hf`: HF EuroBERT or Llama-family directory → dist checkpoint at a chosen TP/PP layout.
Both stream tensors through the one mapping table in `mlmclm.model.hf_mapping`.
"""
