import logging

import numpy as np
import pytest
import torch

from mlmclm.data.blend import BlendConfig, BlendedLoader, build_loader, dataset_seed
from mlmclm.data.loader import LoaderConfig, PackedLoader
from mlmclm.data.manifest import Manifest
from mlmclm.train.config import DataConfig


def blended(datasets, n_batches, gbs, mbs, dp, seed=1234, state=None):
    """The blended global stream (tokens, document ids, sample ids) as all DP ranks together see it."""
    loaders = [BlendedLoader(BlendConfig(datasets, gbs, mbs, seed=seed), r, dp) for r in range(dp)]
    if state is not None:
        for loader in loaders:
            loader.load_state_dict(state)
    out = {"tokens": [], "document_ids": [], "sample_ids": []}
    for _ in range(n_batches):
        for loader in loaders:
            for mb in loader.next_global_batch():
                assert mb["tokens"].shape == (mbs, 32) and mb["tokens"].dtype == torch.int64
                for k in out:
                    out[k].append(mb[k])
    return {k: torch.cat(v) for k, v in out.items()}, loaders[0]


def test_blend_is_the_datasets_own_streams_interleaved_by_weight(dataset, dataset_b):
    blend = {str(dataset): 0.3, str(dataset_b): 0.7}
    n = 40 * 16                                  # more than dataset_b's 1 epoch share: wraps inside the stream
    got, loader = blended(blend, 40, 16, 16, 1)
    assert torch.equal(got["sample_ids"], torch.arange(n))
    # Which dataset each position came from: replay the rule; every prefix is within one sample of the weights.
    which = BlendedLoader(BlendConfig(blend, 16, 16))._assign(n)
    counts = np.cumsum(np.eye(2, dtype=np.int64)[which], axis=0)
    target = np.outer(np.arange(1, n + 1), [0.3, 0.7])
    assert np.abs(counts - target).max() < 1.0
    assert loader.counts == counts[-1].tolist()
    assert loader.proportions() == pytest.approx({str(dataset): 0.3, str(dataset_b): 0.7}, abs=1 / n)
    # The samples of dataset d are, in order, d's own PackedLoader stream (with the blend's seed for d).
    for d, path in enumerate(blend):
        own = PackedLoader(LoaderConfig(path, int(counts[-1, d]), int(counts[-1, d]), seed=dataset_seed(1234, d)))
        want = own.next_global_batch()[0]
        assert torch.equal(got["tokens"][torch.from_numpy(which == d)], want["tokens"])
        assert torch.equal(got["document_ids"][torch.from_numpy(which == d)], want["document_ids"])


def test_blend_same_stream_for_any_dp_and_micro_batch(dataset, dataset_b):
    blend = {str(dataset): 1, str(dataset_b): 2}
    ref, _ = blended(blend, 10, 16, 16, 1)
    for dp, mbs in [(1, 4), (2, 8), (2, 2), (4, 4), (4, 1)]:
        got, _ = blended(blend, 10, 16, mbs, dp)
        assert all(torch.equal(got[k], ref[k]) for k in ref), (dp, mbs)
    other, _ = blended(blend, 10, 16, 16, 1, seed=7)
    assert not torch.equal(other["tokens"], ref["tokens"])
    swapped, _ = blended({str(dataset): 2, str(dataset_b): 1}, 10, 16, 16, 1)
    assert not torch.equal(swapped["tokens"], ref["tokens"])


def test_blend_resume_continues_with_the_next_sample(dataset, dataset_b):
    blend = {str(dataset): 0.25, str(dataset_b): 0.75}
    full, _ = blended(blend, 30, 16, 4, 2)
    _, first = blended(blend, 20, 16, 4, 2)
    state = first.state_dict()
    import json
    state = json.loads(json.dumps(state))       # what a checkpoint's train_state.json holds
    assert state["consumed_samples"] == 20 * 16
    for restored in (state, {"consumed_samples": state["consumed_samples"]}):
        for dp in (1, 4):
            rest, _ = blended(blend, 10, 16, 4, dp, state=restored)
            assert all(torch.equal(rest[k], full[k][20 * 16:]) for k in full), (dp, list(restored))
    with pytest.raises(ValueError, match="weights"):
        BlendedLoader(BlendConfig({str(dataset): 0.5, str(dataset_b): 0.5}, 16, 16)).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        BlendedLoader(BlendConfig(blend, 16, 16, seed=1)).load_state_dict(state)
    single = PackedLoader(LoaderConfig(str(dataset), 16, 16))
    single.next_global_batch()
    with pytest.raises(ValueError, match="single dataset"):
        BlendedLoader(BlendConfig(blend, 16, 16)).load_state_dict(single.state_dict())


def test_blend_logs_realised_proportions(dataset, dataset_b, caplog):
    with caplog.at_level(logging.INFO, logger="mlmclm.data.blend"):
        loader = BlendedLoader(BlendConfig({str(dataset): 1, str(dataset_b): 3}, 16, 16, log_every=5))
        for _ in range(10):
            loader.next_global_batch()
    lines = [r.message for r in caplog.records if "after" in r.message]
    assert len(lines) == 3                                      # batches 1, 5, 10
    assert "after 160 samples" in lines[-1] and "25.00% (target 25.00%" in lines[-1]


def test_blend_refuses_mismatched_datasets(dataset, tmp_path, tok_dir, docs):
    from data_fixtures import write_jsonl

    from mlmclm.data.prepare import PrepareConfig, prepare
    from mlmclm.data.tokenizer import train_bpe

    write_jsonl(tmp_path / "a.jsonl", docs[:50])
    prepare(PrepareConfig(inputs=[str(tmp_path / "a.jsonl")], output_dir=str(tmp_path / "seq16"),
                          tokenizer=str(tok_dir), seq_length=16, workers=1, progress=False))
    with pytest.raises(ValueError, match="seq16.*seq_length 16"):
        BlendedLoader(BlendConfig({str(dataset): 1, str(tmp_path / "seq16"): 1}, 16, 16))
    train_bpe(docs[:100], 280, tmp_path / "other-tok")
    prepare(PrepareConfig(inputs=[str(tmp_path / "a.jsonl")], output_dir=str(tmp_path / "othertok"),
                          tokenizer=str(tmp_path / "other-tok"), seq_length=32, workers=1, progress=False))
    with pytest.raises(ValueError, match="othertok.*tokenizer mismatch"):
        BlendedLoader(BlendConfig({str(dataset): 1, str(tmp_path / "othertok"): 1}, 16, 16))
    for bad in ({}, {str(dataset): 0}, {str(dataset): -1.0}):
        with pytest.raises(ValueError, match="blend"):
            BlendConfig(bad, 16, 16)


def test_data_config_path_or_blend(dataset, dataset_b):
    from mlmclm import config_io

    single = build_loader(DataConfig(path=str(dataset)), 16, 8, 1, 2)
    assert isinstance(single, PackedLoader) and single.dp_rank == 1
    cfg = config_io.from_dict(DataConfig, {"blend": {str(dataset): 1, str(dataset_b): 1}, "seed": 3})
    loader = build_loader(cfg, 16, 8)
    assert isinstance(loader, BlendedLoader) and loader.cfg.seed == 3
    assert loader.manifest.seq_length == 32 and loader.manifest.tokenizer == Manifest.load(dataset).tokenizer
    assert loader.manifest.num_samples == Manifest.load(dataset).num_samples + Manifest.load(dataset_b).num_samples
    for bad in ({}, {"path": str(dataset), "blend": {str(dataset): 1}}, {"blend": {str(dataset): 0}}):
        with pytest.raises(ValueError, match="data"):
            config_io.from_dict(DataConfig, bad)
