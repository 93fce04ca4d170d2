"""A manifest is a file from others: the names it adds to a location (shards, parts, the validation split, a part's
tails) never run a command or reach outside the dataset, through a `pipe:` location, an http URL or a directory."""
import functools
import http.server
import json
import shutil
import threading

import pytest
import torch
from data_fixtures import write_jsonl

from mlmclm.data.loader import LoaderConfig, PackedLoader
from mlmclm.data.manifest import Manifest
from mlmclm.data.partition import MergeError, merge
from mlmclm.data.prepare import PrepareConfig, prepare


def prepare_cfg(inputs, out, tok_dir, **kw):
    kw = {"seq_length": 32, "samples_per_shard": 40, "rows_per_block": 16, "workers": 1, "progress": False,
          "group_docs": 23, **kw}
    return PrepareConfig(inputs=[str(i) for i in inputs], output_dir=str(out), tokenizer=str(tok_dir), **kw)


@pytest.fixture(scope="module")
def merged(tmp_path_factory, tok_dir, docs):
    """Two partitions merged, with a held-out validation split: every kind of name a manifest records."""
    root = tmp_path_factory.mktemp("names")
    inputs = [write_jsonl(root / "docs.jsonl", docs[:200])]
    for i in range(2):
        prepare(prepare_cfg(inputs, root / "ds", tok_dir, partition=i, num_partitions=2, validation_every=8))
    merge(root / "ds")
    return root / "ds"


def read_like_training(location: str):
    """What a training rank does with a dataset: read a batch, then open the recorded validation split."""
    loader = PackedLoader(LoaderConfig(location, 8, 8))
    batch = loader.next_global_batch()
    m = loader.manifest
    if m.validation:
        PackedLoader(LoaderConfig(m.shard_url(m.validation["path"]), 8, 8)).next_global_batch()
    return batch


def planted(merged, tmp_path, edit) -> str:
    """A copy of the merged dataset whose manifest `edit` changed; returns its directory."""
    out = tmp_path / "copy"
    shutil.copytree(merged, out)
    data = json.loads((out / "manifest.json").read_text())
    edit(data)
    (out / "manifest.json").write_text(json.dumps(data))
    return str(out)


def test_names_of_our_own_layouts_load_locally_through_pipe_and_http(merged):
    m = Manifest.load(merged)
    assert m.parts and m.validation and "/" in m.shards[0].name   # part-00000-of-00002/shard-000000.tar
    local = read_like_training(str(merged))
    piped = read_like_training(f"pipe:cat {merged}/manifest.json")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(merged))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        served = read_like_training(f"http://127.0.0.1:{server.server_address[1]}/manifest.json")
    finally:
        server.shutdown()
    for other in (piped, served):
        assert all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(local, other))


# Each hostile value, the field it is planted in, and how: a shell payload writes MARKER if anything runs it.
SHELL = "shard-000000.tar; touch {marker} #"
HOSTILE = {
    "shell in a shard name": ("shards[0].name", lambda d, v: d["shards"][0].update(name=v), SHELL),
    "subshell in a shard name": ("shards[1].name", lambda d, v: d["shards"][1].update(name=v),
                                 "$(touch {marker})shard.tar"),
    "shell in the validation path": ("validation.path", lambda d, v: d["validation"].update(path=v),
                                     "validation/manifest.json; touch {marker} #"),
    "shell in a part": ("parts[0]", lambda d, v: d["parts"].__setitem__(0, v), "part-0`touch {marker}`"),
    "../ in a shard name": ("shards[0].name", lambda d, v: d["shards"][0].update(name=v),
                            "../outside/shard-000000.tar"),
    "../ in the validation path": ("validation.path", lambda d, v: d["validation"].update(path=v),
                                   "../outside/manifest.json"),
    "absolute shard name": ("shards[0].name", lambda d, v: d["shards"][0].update(name=v), "/etc/passwd"),
    "a URL's query in a shard name": ("shards[0].name", lambda d, v: d["shards"][0].update(name=v),
                                      "shard-000000.tar?redirect=@evil.example"),
}


@pytest.mark.parametrize("through", ["pipe", "directory"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_names_are_refused_before_anything_runs(merged, tmp_path, case, through):
    field, plant, template = HOSTILE[case]
    marker = tmp_path / "MARKER"
    value = template.format(marker=marker)
    if case.startswith("../"):   # a real dataset beside the copy, so that today's code would read it
        shutil.copytree(merged, tmp_path / "outside")
    copy = planted(merged, tmp_path, lambda data: plant(data, value))
    location = f"pipe:cat {copy}/manifest.json" if through == "pipe" else copy
    with pytest.raises(ValueError) as refused:
        read_like_training(location)
    message = str(refused.value)
    assert field in message and repr(value) in message and "manifest.json" in message
    assert not marker.exists()


def test_a_parts_tails_name_is_checked_and_merge_refuses_parts_it_could_not_name(merged, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(merged, root)
    part = root / "part-00000-of-00002" / "manifest.json"
    data = json.loads(part.read_text())
    data["tails"]["name"] = "../../elsewhere/tails.npz"
    part.write_text(json.dumps(data))
    with pytest.raises(MergeError, match=r"tails\.name.*'\.\./\.\./elsewhere/tails\.npz'"):
        merge(root)

    # A part outside the output directory would be named "../…" by the merged manifest, which no reader accepts:
    # the merge refuses it before writing anything.
    shutil.copytree(merged, tmp_path / "fresh")
    outside = tmp_path / "part-00001-of-00002"
    shutil.move(tmp_path / "fresh" / "part-00001-of-00002", outside)
    before = (tmp_path / "fresh" / "manifest.json").read_bytes()
    with pytest.raises(MergeError, match="must lie under it"):
        merge(tmp_path / "fresh", [tmp_path / "fresh" / "part-00000-of-00002", outside])
    assert (tmp_path / "fresh" / "manifest.json").read_bytes() == before
