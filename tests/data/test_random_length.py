"""Random-length samples (the paper's): lengths uniform in [min, max], cut from the row stream without dropping a
token, the same samples on any DP size and after a resume, micro-batches padded as the trainer needs."""
import numpy as np
import pytest
import torch

from mlmclm.data.loader import LoaderConfig, PackedLoader
from mlmclm.data.random_length import RandomLengthLoader, SampleLengths, sample_lengths

LENGTHS = SampleLengths(3, 40)  # rows of 32 tokens: samples both shorter and longer than a row


def test_lengths_are_uniform_in_range_and_a_pure_function_of_the_index():
    paper = SampleLengths(12, 2048)
    draw = sample_lengths(1234, 0, 1_000_000, paper)
    assert draw.min() == 12 and draw.max() == 2048
    assert abs(draw.mean() - paper.mean) <= 0.01 * paper.mean   # 1030 tokens on average: the paper's batch
    counts = np.bincount(draw - 12, minlength=2037)
    assert counts.min() > 0.8 * counts.mean() and counts.max() < 1.2 * counts.mean()   # flat, no corner empty
    # Any window of the stream draws the same lengths: what a resume or another rank computes.
    assert np.array_equal(sample_lengths(1234, 500, 1000, paper), draw[500:1500])
    assert not np.array_equal(sample_lengths(1235, 0, 1000, paper), draw[:1000])


def test_bad_lengths_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="data.random_length"):
        SampleLengths(12, 11)
    with pytest.raises(ValueError, match="data.random_length"):
        SampleLengths(1, 2048)


def loader(dataset, dp_rank=0, dp_size=1, global_batch=8, micro=2, **kwargs):
    return RandomLengthLoader(LoaderConfig(str(dataset), global_batch, micro, seed=7, prefetch=False), LENGTHS,
                              dp_rank, dp_size, **kwargs)


def samples_of(micro_batches) -> dict[int, list[int]]:
    """Sample index -> its tokens, from micro-batches of samples laid end to end."""
    out = {}
    for mb in micro_batches:
        ids, tokens, positions = mb["sample_ids"][0], mb["tokens"][0], mb["positions"][0]
        for sample in ids.unique().tolist():
            if sample >= 0:
                where = ids == sample
                assert torch.equal(positions[where], torch.arange(int(where.sum())))
                out[sample] = tokens[where].tolist()
    return out


def test_samples_cut_the_row_stream_end_to_end_without_dropping_a_token(dataset):
    rows = PackedLoader(LoaderConfig(str(dataset), 1, 1, seed=7, prefetch=False))
    stream = torch.cat([rows.next_global_batch()[0]["tokens"].reshape(-1) for _ in range(40)]).tolist()
    rl = loader(dataset)
    seen, lengths = {}, []
    for _ in range(5):
        seen.update(samples_of(rl.next_global_batch()))
        lengths.extend(rl.last_lengths.tolist())
    assert sorted(seen) == list(range(40)) and [len(seen[k]) for k in range(40)] == lengths
    assert all(LENGTHS.min_length <= n <= LENGTHS.max_length for n in lengths)
    flat = [t for k in range(40) for t in seen[k]]
    assert flat == stream[:len(flat)]   # consecutive pieces of the shuffled row stream, crossing row ends
    assert rl.position == len(flat)


def test_same_samples_on_dp1_and_dp2_and_across_a_resume(dataset):
    single = loader(dataset)
    reference = [samples_of(single.next_global_batch()) for _ in range(6)]
    halves = [loader(dataset, rank, 2) for rank in (0, 1)]
    for step in range(3):
        merged = {}
        for half in halves:
            merged.update(samples_of(half.next_global_batch()))
        assert merged == reference[step]
    state = halves[1].state_dict()
    resumed = [loader(dataset, rank, 2) for rank in (0, 1)]
    for half in resumed:
        half.load_state_dict(state)
    for step in range(3, 6):
        merged = {}
        for half in resumed:
            merged.update(samples_of(half.next_global_batch()))
        assert merged == reference[step], step
    with pytest.raises(ValueError, match="sample lengths"):
        other = RandomLengthLoader(LoaderConfig(str(dataset), 8, 2, seed=7), SampleLengths(3, 41))
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="fixed-length rows"):
        loader(dataset).load_state_dict(PackedLoader(LoaderConfig(str(dataset), 8, 2, seed=7)).state_dict())


def test_micro_batches_are_padded_for_the_layout(dataset):
    micro = loader(dataset, micro=2, pad_multiple=16).next_global_batch()
    assert len(micro) == 4
    for mb in micro:
        width = mb["tokens"].shape[1]
        real = int((mb["sample_ids"] >= 0).sum())
        assert width % 16 == 0 and real <= width < real + 16 and int(mb["lengths"].sum()) == real
        assert set(mb["sample_ids"][0, real:].tolist()) <= {-1}   # padding only at the end, no sample id
    same = loader(dataset, micro=2, pad_multiple=16, same_length=True).next_global_batch()
    assert len({mb["tokens"].shape[1] for mb in same}) == 1   # pipeline parallelism: one shape per step
    assert max(mb["tokens"].shape[1] for mb in micro) == same[0]["tokens"].shape[1]
