"""A BERT-style tokenizer without BOS/EOS (ModernBERT's: [CLS], [SEP], [MASK], [PAD]) prepares data: its CLS and SEP
take the BOS and EOS roles, so each document is packed [CLS] … [SEP] (it was refused: "has no bos token")."""
import numpy as np

SPECIALS = ["[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]"]
WORDS = ["the", "patient", "was", "given", "aspirin", "and", "recovered"]


def _bert_style_tokenizer(out_dir):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIALS + WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                   pad_token="[PAD]", unk_token="[UNK]")
    fast.save_pretrained(str(out_dir))
    return out_dir


def test_cls_and_sep_frame_the_documents(tmp_path):
    from mlmclm.data.manifest import Manifest
    from mlmclm.data.prepare import PrepareConfig, prepare
    from mlmclm.data.tokenizer import load_tokenizer, tokenizer_identity

    tokenizer = _bert_style_tokenizer(tmp_path / "tok")
    identity = tokenizer_identity(load_tokenizer(str(tokenizer)))
    assert (identity["bos_id"], identity["eos_id"], identity["mask_id"]) == (0, 1, 2)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("\n".join('{"text": "the patient was given aspirin and recovered"}' for _ in range(40)) + "\n")
    prepare(PrepareConfig(inputs=[str(docs)], output_dir=str(tmp_path / "data"), tokenizer=str(tokenizer),
                          seq_length=9, workers=1, progress=False))
    from mlmclm.data.shards import read_shard

    m = Manifest.load(str(tmp_path / "data"))
    assert m.tokenizer["bos_id"] == 0 and m.tokenizer["eos_id"] == 1
    rows, _ = read_shard(m.shard_url(m.shards[0].name), m.shards[0], m.seq_length, m.tokenizer["pad_id"])
    assert np.asarray(rows[0]).tolist() == [0, 5, 6, 7, 8, 9, 10, 11, 1]  # [CLS] the patient … recovered [SEP]
