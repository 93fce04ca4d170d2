"""Fine-tuning on the run's device (issue 53 part 1), as far as a CPU-only machine can show it: everything is placed
on the device (a `meta` device, where any tensor left on the host fails the op it meets), no step reads a device
tensor back to the host (on `meta` any read raises: the loop reaches its last step and fails only at the final
read), batches are collated by a thread ahead of the loop, the attention makes no host read, `--device cuda`
without a GPU is refused in one line, and a run whose weights are all NaN stops early with the score, losses and
flag of the run stepped to its end. What only a GPU shows (the copies overlapping the kernels, SDPA's GPU kernels,
the speed) is the GPU session's (benchmarks/gpu_session.sh, section finetune)."""
import json
import math
import threading
from dataclasses import replace

import pytest
import torch
from eval_fixtures import evaluate_main, make_task_folder

from mlmclm.eval.finetune import training
from mlmclm.eval.finetune.device import resolve_device
from mlmclm.eval.finetune.encodeval_heads import EncodEvalSequenceClassifier
from mlmclm.eval.finetune.protocol import ProtocolConfig
from mlmclm.eval.finetune.runner import finetune_and_score
from mlmclm.eval.finetune.task_loading import load_task
from mlmclm.eval.finetune.task_spec import TaskSpec
from mlmclm.eval.finetune.training import FinetuneConfig, in_precision, pad_batch, train


def _rows(n=20):
    return [{"input_ids": [5 + i % 7] * (3 + i % 5), "attention_mask": [1] * (3 + i % 5), "labels": i % 2}
            for i in range(n)]


def _collate(features):
    return pad_batch(features, {"input_ids": 3, "attention_mask": 0})


def test_every_step_runs_on_the_device_without_reading_it_back(tiny_model_dir):
    # meta tensors hold no data: an op mixing one with a host tensor raises, and so does any read to the host
    # (.item(), bool(), .tolist(): transformers' own SDPA mask check `padding_mask.all()` among them)
    config = FinetuneConfig(learning_rate=1e-3, max_steps=6, max_epochs=None, batch_size=8, micro_batch_size=4,
                            device="meta")
    model = in_precision(EncodEvalSequenceClassifier(tiny_model_dir, 2), config)
    assert {p.device.type for p in model.parameters()} == {"meta"}  # the encoder and the heads
    seen = []
    model.register_forward_pre_hook(lambda m, args, kwargs: seen.append({k: v.device.type for k, v in kwargs.items()}),
                                    with_kwargs=True)
    with pytest.raises(NotImplementedError, match="meta tensor"):  # the one read: the losses, after the last step
        train(model, _rows(), _collate, lambda m, b: m(**b).loss, config)
    # 20 rows at 8 a step, micro-batches of 4: steps of 2, 2, 1 micro-batches, twice
    assert len(seen) == 10 and all(set(batch.values()) == {"meta"} for batch in seen), seen


def test_batches_are_collated_by_a_thread_ahead_of_the_loop():
    threads, order = [], []

    def collate(features):
        threads.append(threading.current_thread().name)
        order.append(("collate", len(threads)))
        return torch.stack(features)

    def loss(forward, batch):
        order.append(("step", len(threads)))
        return forward(batch).sum()

    config = FinetuneConfig(learning_rate=1e-3, max_steps=5, max_epochs=None, batch_size=4)
    train(torch.nn.Linear(1, 1), list(torch.arange(16.0).reshape(16, 1)), collate, loss, config)
    assert set(threads) == {"finetune-prefetch"}
    assert len(threads) == 5 and not any(t.name == "finetune-prefetch" for t in threading.enumerate())
    steps = [collated for what, collated in order if what == "step"]
    assert any(collated > index + 1 for index, collated in enumerate(steps)), order  # collated ahead of its step


def test_a_collate_error_reaches_the_loop():
    def collate(features):
        raise ValueError("a row the collator cannot read")

    config = FinetuneConfig(learning_rate=1e-3, max_steps=2, max_epochs=None, batch_size=4)
    with pytest.raises(ValueError, match="a row the collator cannot read"):
        train(torch.nn.Linear(1, 1), list(torch.ones(8, 1)), collate, lambda f, b: f(b).sum(), config)


def test_the_attention_without_host_read_gives_sdpas_numbers(tiny_model_dir):
    from transformers import AutoModel

    from mlmclm.eval.finetune.loading import load_options

    ids = torch.randint(5, 30, (4, 9), generator=torch.Generator().manual_seed(0))
    for padded in (True, False):
        mask = torch.ones(4, 9, dtype=torch.long)
        if padded:
            mask[0, 6:] = 0
        outputs = [AutoModel.from_pretrained(tiny_model_dir, trust_remote_code=False, **options)(
            input_ids=ids, attention_mask=mask).last_hidden_state
            for options in ({"attn_implementation": "sdpa"}, load_options())]
        assert torch.equal(*outputs)


def test_device_cuda_without_a_gpu_is_refused_in_one_line(tiny_model_dir, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    out = tmp_path / "out"
    code = evaluate_main()(["grid", "--model", f"tiny={tiny_model_dir}", "--smoke", "--device", "cuda",
                            "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("evaluate: error: --device cuda: no CUDA device is visible here"), err
    assert not out.exists()


@pytest.mark.parametrize("family", ["classification", "retrieval"])
def test_a_run_whose_weights_all_went_nan_stops_with_the_score_of_the_run_stepped_to_its_end(
        family, tiny_model_dir, tmp_path, monkeypatch):
    data = load_task(TaskSpec(name="t", family=family, rules="encodeval", path=str(
        make_task_folder(tmp_path / "data", family, sizes=(32, 8, 8)))))
    config = replace(ProtocolConfig.paper(dtype="float32", batch_size=8).finetune_config(1e3, 0, family),
                     max_steps=16, max_epochs=None)
    forwards = []
    head = type(EncodEvalSequenceClassifier(tiny_model_dir, 2).encoder)
    real = head.forward
    monkeypatch.setattr(head, "forward", lambda self, *a, **k: forwards.append(torch.is_grad_enabled()) or
                        real(self, *a, **k))
    outcomes = {}
    for every in (2, 10 ** 9):  # checked every 2 steps, and never (EncodEval's loop: every step to the end)
        monkeypatch.setattr(training, "DIVERGENCE_CHECK_STEPS", every)
        forwards.clear()
        outcomes[every] = (finetune_and_score(tiny_model_dir, data, config), forwards.count(True))
    (early, early_forwards), (full, full_forwards) = outcomes[2], outcomes[10 ** 9]
    assert full.log.stopped_at is None and early.log.stopped_at is not None and early.log.stopped_at < 16
    assert early_forwards < full_forwards  # the steps after the stop were not run
    assert early.log.diverged and full.log.diverged
    # the same record: scores, losses (NaN where the stepped run's were), steps
    assert json.dumps(early.metrics, sort_keys=True) == json.dumps(full.metrics, sort_keys=True)
    assert repr(early.log.losses) == repr(full.log.losses) and early.log.steps == full.log.steps == 16
    assert all(math.isnan(v) for v in full.log.losses[early.log.stopped_at:])
