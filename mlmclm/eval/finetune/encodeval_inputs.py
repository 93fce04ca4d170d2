"""EncodEval's model inputs: what its evaluators feed the encoder, read in rimads/avey-b `EncodEval/encodeval/` at
810ad06 (modified from hgissbkh/EncodEval@MLM_vs_CLM, whose stored copy lacks the evaluator files; see
encodeval_scores.py) and in sentence-transformers, which EncodEval's retrieval runs through. The released results
hold scores only: none of these rules can be checked against them; the text + EOS rule is also in the fork
Theodb/EncodEval (`encodeval/eval_tasks/token_classification_eval.py`, `eurobert_tokenization_fn`).

Each function returns the tokenizer's BatchEncoding (lists, unpadded unless said otherwise)."""
from __future__ import annotations

import json
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from mlmclm.eval.finetune.training import load_tokenizer

QA_QUESTION = "Question: {question}\nContext: "  # QA.py tokenize: the first sequence; the context is the second


def encodeval_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    """The model's fast tokenizer with its special tokens taken from the model's config, as abstract_eval.py
    (EvalConfig.__post_init__) copies `bos/eos/pad/mask_token_id` from the model config onto the tokenizer (the
    config wins where they differ); no pad token: the EOS pads. An EOS token is required (every input ends with
    it): the stored branch's abstract_eval.py has no fallback either (avey-b's copy falls back to the unknown
    token, which would train on a wrong marker)."""
    tokenizer = load_tokenizer(model_dir)
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id"):
        value = config.get(name)
        if isinstance(value, int) and 0 <= value < len(tokenizer):
            setattr(tokenizer, name, value)
    if tokenizer.eos_token is None:
        raise ValueError(f"{model_dir}: EncodEval's inputs end with the EOS token, and this model has none "
                         f"(tokenizer and config.json eos_token_id)")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def text_inputs(tokenizer: PreTrainedTokenizerBase, texts: list[str], max_length: int, offsets: bool = False):
    """`text + EOS`, no special tokens added (no BOS), cut at `max_length` — the EOS too when the text is long.

    SC.py, TC.py and IR.py `tokenize`: `tokenizer([t + tokenizer.eos_token ...], truncation=True,
    max_length=self.max_length, add_special_tokens=False)` (TC with `return_offsets_mapping=True`; IR, used by its
    training collator, pads). The EOS is written into the text, so a fast tokenizer reads it as the special token
    and gives it the characters after the text as offsets."""
    return tokenizer([text + tokenizer.eos_token for text in texts], truncation=True, max_length=max_length,
                     add_special_tokens=False, return_offsets_mapping=offsets)


def qa_inputs(tokenizer: PreTrainedTokenizerBase, questions: list[str], contexts: list[str], max_length: int):
    """QA.py `tokenize`: the pair ("Question: {q}\\nContext: ", context + EOS), no special tokens, only the context
    truncated, one input per question (no windows: what does not fit is cut), with offsets."""
    return tokenizer([QA_QUESTION.format(question=q) for q in questions],
                     [context + tokenizer.eos_token for context in contexts], max_length=max_length,
                     truncation="only_second", return_offsets_mapping=True, add_special_tokens=False)


def retrieval_lengths(tokenizer: PreTrainedTokenizerBase, model_dir: Path) -> tuple[int, int]:
    """(training length, evaluation length) of EncodEval's retrieval runs. sentence-transformers' `Transformer`
    module (models/Transformer.py) sets `max_seq_length = min(max_position_embeddings, tokenizer.model_max_length)`;
    abstract_eval.py trains at round(0.99 x that); evaluation encodes through the module, cut at the full value."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    longest = min(config["max_position_embeddings"], tokenizer.model_max_length)
    return round(0.99 * longest), longest


def retrieval_eval_inputs(tokenizer: PreTrainedTokenizerBase, texts: list[str], max_length: int):
    """How EncodEval's retrieval *evaluation* tokenizes queries and documents: IR.py `encode_sequences` calls
    `SentenceTransformer.encode`, which tokenizes with the sentence-transformers module (models/Transformer.py
    `tokenize`: each text stripped, the tokenizer's own special tokens — BOS ... as its template adds them, not the
    text + EOS of training —, `truncation="longest_first"`, cut at `max_seq_length`), padded, as tensors."""
    return tokenizer([str(text).strip() for text in texts], padding=True, truncation="longest_first",
                     max_length=max_length, return_tensors="pt")
