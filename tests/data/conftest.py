import pytest

from data_fixtures import make_docs, write_jsonl
from mlmclm.data.tokenizer import train_bpe


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "small-bpe"
    train_bpe(make_docs(200, seed=99), 300, path)
    return path


@pytest.fixture(scope="session")
def docs():
    return make_docs(400)


@pytest.fixture(scope="session")
def dataset(tmp_path_factory, tok_dir, docs):
    """A small prepared dataset: 400 documents, rows of 32 tokens, 100 rows per shard."""
    from mlmclm.data.prepare import PrepareConfig, prepare

    src = tmp_path_factory.mktemp("src")
    write_jsonl(src / "docs.jsonl", docs)
    out = tmp_path_factory.mktemp("ds")
    prepare(PrepareConfig(inputs=[str(src / "docs.jsonl")], output_dir=str(out), tokenizer=str(tok_dir),
                          seq_length=32, samples_per_shard=100, rows_per_block=16, workers=1, progress=False))
    return out


@pytest.fixture(scope="session")
def dataset_b(tmp_path_factory, tok_dir):
    """A second dataset with the same tokenizer and sequence length: 300 other documents, 60 rows per shard."""
    from mlmclm.data.prepare import PrepareConfig, prepare

    src = tmp_path_factory.mktemp("src_b")
    write_jsonl(src / "docs.jsonl", make_docs(300, seed=5))
    out = tmp_path_factory.mktemp("ds_b")
    prepare(PrepareConfig(inputs=[str(src / "docs.jsonl")], output_dir=str(out), tokenizer=str(tok_dir),
                          seq_length=32, samples_per_shard=60, rows_per_block=16, workers=1, progress=False))
    return out
