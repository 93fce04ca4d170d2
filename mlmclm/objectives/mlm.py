"""Masked LM: select `mask_ratio` of the non-special tokens and predict them, with bidirectional attention.

Selection and corruption use counter-based randoms (see `hashing`): a sample masks the same way on every device,
parallel layout and restart, given the seed and its global sample index. Everything is vectorised on the batch's
device.
"""
from __future__ import annotations

import torch

from mlmclm.objectives.batch import IGNORE_INDEX, ObjectiveBatch
from mlmclm.objectives.hashing import randoms_at, threshold, token_randoms

_SELECT, _ACTION, _RANDOM_TOKEN = 1, 2, 3  # independent random streams


class MaskedLM:
    name = "mlm"
    causal = False

    def __init__(self, *, mask_ratio: float, mask_mode: str, special_token_ids: list[int], mask_token_id: int,
                 vocab_size: int, seed: int):
        specials = set(special_token_ids) | {mask_token_id}
        if not 0 <= mask_token_id < vocab_size:
            raise ValueError(f"mask_token_id {mask_token_id} outside the vocabulary [0, {vocab_size})")
        self.mask_ratio = mask_ratio
        self.mask_mode = mask_mode
        self.mask_token_id = mask_token_id
        self.vocab_size = vocab_size
        self.seed = seed
        self._specials = sorted(specials)
        # Random replacements are drawn among ordinary tokens only.
        self._ordinary = sorted(set(range(vocab_size)) - specials) if mask_mode == "80_10_10" else []
        self._device_tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._device_tables:
            self._device_tables[device] = (
                torch.tensor(self._specials, dtype=torch.int64, device=device),
                torch.tensor(self._ordinary, dtype=torch.int64, device=device),
            )
        return self._device_tables[device]

    def prepare(self, tokens: torch.Tensor, sample_ids: torch.Tensor,
                positions: torch.Tensor | None = None, mask_ratio: float | None = None) -> ObjectiveBatch:
        """`sample_ids` [b]: one sample per row. Or, for samples laid end to end, `sample_ids` and `positions`
        [b, S] per token (sample id -1 on padding, never masked): a token masks the same way in either layout.
        `mask_ratio`: this batch's rate (a step of a mask-rate schedule), else the objective's own. A token is
        selected when its random falls below the rate, so at a lower rate the selection is a subset of the one at a
        higher rate: a schedule only ever drops tokens from (or adds tokens to) the same draw."""
        ratio = self.mask_ratio if mask_ratio is None else mask_ratio
        if not 0.0 < ratio < 1.0:
            raise ValueError(f"mask ratio must be strictly between 0 and 1, got {ratio!r}")
        per_token = positions is not None
        expected = tokens.shape if per_token else tokens.shape[:1]
        if tokens.dim() != 2 or sample_ids.shape != expected:
            raise ValueError(f"expected tokens [b, S] and sample_ids [b] (or [b, S] with positions), got "
                             f"{tuple(tokens.shape)} and {tuple(sample_ids.shape)}")
        specials, ordinary = self._tables(tokens.device)
        seq_len = tokens.shape[1]
        sample_ids = sample_ids.to(tokens.device)
        if per_token:
            positions = positions.to(tokens.device)

        def randoms(stream: int) -> torch.Tensor:
            if per_token:
                return randoms_at(self.seed, sample_ids, positions, stream)
            return token_randoms(self.seed, sample_ids, seq_len, stream)

        eligible = ~torch.isin(tokens, specials)
        if per_token:
            eligible &= sample_ids >= 0
        selected = eligible & (randoms(_SELECT) < threshold(ratio))

        labels = torch.where(selected, tokens, torch.full_like(tokens, IGNORE_INDEX))
        if self.mask_mode == "mask_only":
            input_ids = torch.where(selected, torch.full_like(tokens, self.mask_token_id), tokens)
        else:  # 80% mask, 10% random ordinary token, 10% keep
            action = randoms(_ACTION)
            to_mask = selected & (action < threshold(0.8))
            to_random = selected & (action >= threshold(0.8)) & (action < threshold(0.9))
            picks = ordinary[randoms(_RANDOM_TOKEN) % ordinary.numel()]
            input_ids = torch.where(to_mask, torch.full_like(tokens, self.mask_token_id), tokens)
            input_ids = torch.where(to_random, picks.to(tokens.dtype), input_ids)
        return ObjectiveBatch(input_ids, labels, selected.float(), causal=False, num_predicted=selected.sum(),
                             num_maskable=eligible.sum())
