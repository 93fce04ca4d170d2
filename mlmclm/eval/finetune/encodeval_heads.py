"""EncodEval's task heads on our encoders: the heads of its own model classes (`sl_model`), which the paper's runs
used, put over any Hugging Face encoder directory (`AutoModel`: for our exports, EuroBERT's base model).

Read in rimads/avey-b EncodEval/encodeval/modeling/modeling_sl_model.py and configuration_sl_model.py at 810ad06
(modified from hgissbkh/EncodEval@MLM_vs_CLM, whose stored copy lacks `encodeval/modeling/`), and, for retrieval,
in abstract_eval.py (the `retrieval_pooling == "eos"` switch) and sentence-transformers' `Pooling` module. The
configs load these classes through `AutoModelForSequenceClassification` / `AutoModelForTokenClassification`
(`configs/{SC,TC,QA}/*.yaml`; QA with `num_labels: 2`) and `SentenceTransformer` (`configs/IR/*.yaml`). The released
results hold scores only: these heads are read in the code, not checked against them.

Pooling: the paper models' own `classifier_pooling` / `retrieval_pooling` values could not be read (their configs
are on the hub, unreachable from here); SLModelConfig's default for both is "mean". A model config that says "eos"
gets the last real token; any other value — EuroBERT's "late" or "bos", which the SL head refuses — gets the
default, mean.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoModel
from transformers.modeling_outputs import SequenceClassifierOutput, TokenClassifierOutput

from mlmclm.eval.finetune.loading import load_options

POOLINGS = ("mean", "eos")  # SLModelForSequenceClassification.forward; anything else raises NotImplementedError
DEFAULT_TOKEN_DROPOUT = 0.1  # SLModelForTokenClassification: classifier_dropout, else hidden_dropout, else 0.1


def pooling_of(config, attribute: str) -> str:
    """The SL pooling a model config asks for (`classifier_pooling` or `retrieval_pooling`): "eos" or "mean"."""
    value = getattr(config, attribute, None)
    return value if value in POOLINGS else "mean"


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """SL pooling over right-padded batches: "mean" = the mean over real tokens; "eos" = the last real token
    (position attention_mask.sum() - 1, which is the EOS every EncodEval input ends with unless cut)."""
    if pooling == "eos":
        last = attention_mask.sum(dim=1) - 1
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def init_like_sl(*layers: nn.Linear, std: float) -> None:
    """SLPreTrainedModel._init_weights for the new head layers: weights ~ N(0, initializer_range), biases 0."""
    for layer in layers:
        nn.init.normal_(layer.weight, mean=0.0, std=std)
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)


class EncodEvalSequenceClassifier(nn.Module):
    """SLModelForSequenceClassification's head: pooling (`classifier_pooling`), then dense (hidden -> hidden), GELU,
    classifier (hidden -> labels); no dropout; cross-entropy on the logits, in fp32."""

    def __init__(self, model_dir: Path, num_labels: int):
        super().__init__()
        self.encoder = AutoModel.from_pretrained(model_dir, trust_remote_code=False, **load_options())
        config = self.encoder.config
        self.pooling = pooling_of(config, "classifier_pooling")
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.GELU()
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_like_sl(self.dense, self.classifier, std=config.initializer_range)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                labels: torch.Tensor | None = None) -> SequenceClassifierOutput:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.classifier(self.activation(self.dense(pool(hidden, attention_mask, self.pooling))))
        # in fp32, as the SL head's CrossEntropyLoss runs under the Trainer's bf16 autocast (precision.py)
        loss = None if labels is None else nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]).float(),
                                                                       labels.view(-1))
        return SequenceClassifierOutput(loss=loss, logits=logits)


class EncodEvalTokenClassifier(nn.Module):
    """SLModelForTokenClassification's head (TC, and QA as inside/outside tagging with 2 labels): dropout (the
    config's classifier_dropout, else hidden_dropout, else 0.1 — what the paper's SL configs, which set neither,
    got), then a linear layer; the loss is transformers' token-classification loss (logits upcast to fp32,
    positions labelled -100 ignored)."""

    def __init__(self, model_dir: Path, num_labels: int):
        super().__init__()
        self.encoder = AutoModel.from_pretrained(model_dir, trust_remote_code=False, **load_options())
        config = self.encoder.config
        rate = next((value for value in (getattr(config, "classifier_dropout", None),
                                         getattr(config, "hidden_dropout", None)) if value is not None),
                    DEFAULT_TOKEN_DROPOUT)
        self.dropout = nn.Dropout(rate)
        self.score = nn.Linear(config.hidden_size, num_labels)
        init_like_sl(self.score, std=config.initializer_range)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                labels: torch.Tensor | None = None) -> TokenClassifierOutput:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.score(self.dropout(hidden))
        loss = None if labels is None else nn.functional.cross_entropy(
            logits.view(-1, logits.shape[-1]).float(), labels.view(-1), ignore_index=-100)
        return TokenClassifierOutput(loss=loss, logits=logits)


class EncodEvalRetrievalEncoder(nn.Module):
    """The sentence-transformers model EncodEval builds from an encoder directory (Transformer + Pooling, no
    normalisation module): mean pooling over real tokens, or the last real token when the config's
    `retrieval_pooling` is "eos" (abstract_eval.py switches the Pooling module to `pooling_mode_lasttoken`).
    Returns the pooled vector as it is; the similarity (cosine) normalises."""

    def __init__(self, model_dir: Path):
        super().__init__()
        self.encoder = AutoModel.from_pretrained(model_dir, trust_remote_code=False, **load_options())
        self.pooling = pooling_of(self.encoder.config, "retrieval_pooling")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return pool(hidden, attention_mask, self.pooling)
