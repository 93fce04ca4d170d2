"""The exported tokenizer's mask token takes the space before it (RoBERTa's `<mask>` does): "of our <|mask|>."
puts no lone-space token before the mask, and nothing else changes."""
from transformers import AutoTokenizer

from mlmclm.convert.to_hf import mask_absorbs_space
from mlmclm.data.tokenizer import load_tokenizer, vocab_hash

QUERY = "Now is the winter of our <|mask|>."


def test_the_mask_absorbs_the_space_before_it_and_nothing_else_changes(tmp_path):
    tok = load_tokenizer("embedded")
    before = tok.convert_ids_to_tokens(tok(QUERY)["input_ids"])
    assert before[-5:-2] == ["Ġour", "Ġ", "<|mask|>"]  # as trained: a lone space before the mask
    plain = "Now is the winter of our discontent."
    ids, vocab = tok(plain)["input_ids"], vocab_hash(tok)
    mask_absorbs_space(tok)
    tok.save_pretrained(str(tmp_path))
    exported = AutoTokenizer.from_pretrained(str(tmp_path))
    assert exported.convert_ids_to_tokens(exported(QUERY)["input_ids"])[-4:-2] == ["Ġour", "<|mask|>"]
    assert exported(plain)["input_ids"] == ids and vocab_hash(exported) == vocab
    assert exported.mask_token_id == tok.mask_token_id == 2
