"""Downstream evaluation: fine-tune and score HF encoder directories on four task families."""
