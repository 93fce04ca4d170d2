"""ModernBERT on megatron-core: its layers (spec.py, attention.py), its MLM head (head.py) and its Hugging Face
mapping table (hf_mapping.py). `mlmclm.model.architectures` ties them to the builder."""
