"""Each phase's data: one loader per distinct data source of the plan, each with its own position.

A phase reads its own data (`phases[].data`) or the run's; phases naming the same data share its loader, so a plan
A → B → A reads on in A where the first phase left off, and B starts at its own beginning. Every source's position
is in the checkpoint (`loaders`, in the order of first use), so a resume inside or across any phase is exact.

On a resume or a branch at step N, a source some phase read before N continues from its saved position; a source
first read at or after N starts at its beginning. The branch rules (the phases before N, their data included, equal
the parent's) make the sources read before N the same, in the same order, in both configs.
"""
from __future__ import annotations

from mlmclm.data.blend import build_loader
from mlmclm.model.precision import fp8_token_alignment
from mlmclm.train.config import TrainConfig


class PhaseLoaders:
    def __init__(self, cfg: TrainConfig, dp_rank: int, dp_size: int, pad_multiple: int = 1,
                 same_length: bool = False):
        self.cfg = cfg
        self.streams, self.of_phase = cfg.data_streams()
        self.loaders = []
        try:
            for data in self.streams:
                # every source must be tokenized as the first one is (checked against its manifest)
                expected = self.loaders[0].manifest.tokenizer if self.loaders else None
                self.loaders.append(build_loader(data, cfg.global_batch_size, cfg.micro_batch_size, dp_rank, dp_size,
                                                 expected, pad_multiple=pad_multiple, same_length=same_length))
        except BaseException:
            self.close()
            raise

    @property
    def manifest(self):
        """The first phase's data: its tokenizer is the run's, its validation split the run's default."""
        return self.loaders[0].manifest

    def for_phase(self, index: int):
        return self.loaders[self.of_phase[index]]

    def seq_length(self, index: int) -> int:
        return self.for_phase(index).manifest.seq_length

    def context_length(self, index: int) -> int:
        """The longest sample a step of phase `index` trains on: its prepared rows, or its longest random length."""
        lengths = self.streams[self.of_phase[index]].random_length
        return self.seq_length(index) if lengths is None else lengths.max_length

    @property
    def consumed_samples(self) -> int:
        return sum(loader.consumed_samples for loader in self.loaders)

    def _read_before(self, step: int) -> set[int]:
        return {self.of_phase[i] for i, (start, _) in enumerate(self.cfg.phase_bounds()) if start < step}

    def state_dict(self) -> list[dict]:
        return [loader.state_dict() for loader in self.loaders]

    def load_state_dict(self, train_state: dict) -> None:
        """Positions from a checkpoint's train state at step `iteration` (`loaders`; a checkpoint from before
        per-phase data holds one `loader`)."""
        saved = train_state.get("loaders")
        if saved is None:
            saved = [train_state["loader"]]
        for index in sorted(self._read_before(int(train_state["iteration"]))):
            if index >= len(saved):
                raise ValueError(f"the checkpoint holds the positions of {len(saved)} data sources, but this "
                                 f"config's phases read {index + 1} before its step {train_state['iteration']}")
            self.loaders[index].load_state_dict(saved[index])

    def close(self) -> None:
        for loader in self.loaders:
            loader.close()


def padding(cfg: TrainConfig) -> dict:
    """How random-length micro-batches are padded: to a multiple of the FP8 alignment per tensor-parallel rank
    (`fp8_token_alignment`: 16, 32 for MXFP8; sequence parallelism divides by TP), and with pipeline parallelism
    every micro-batch of a step to the same length (megatron's stages exchange fixed shapes)."""
    return {"pad_multiple": fp8_token_alignment(cfg.precision) * cfg.parallel.tensor_parallel,
            "same_length": cfg.parallel.pipeline_parallel > 1}
