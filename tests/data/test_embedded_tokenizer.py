import multiprocessing as mp

from transformers import AutoTokenizer

from mlmclm.data import tokenizer as tk


def _build(cache, queue):
    import os
    os.environ["MLMCLM_CACHE"] = cache
    queue.put(str(tk.embedded_tokenizer_dir()))


def test_embedded_tokenizer_roles_cache_and_race(tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_build, args=(cache, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    dirs = {queue.get(timeout=120) for _ in procs}
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert len(dirs) == 1
    monkeypatch.setenv("MLMCLM_CACHE", cache)
    path = tk.embedded_tokenizer_dir()
    assert str(path) in dirs
    leftovers = [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]
    assert leftovers == []

    tok = AutoTokenizer.from_pretrained(str(path))
    assert len(tok) == tk.EMBEDDED_VOCAB_SIZE
    assert (tok.bos_token, tok.eos_token, tok.mask_token, tok.pad_token) == (tk.BOS, tk.EOS, tk.MASK, tk.PAD)
    ids = tok("To be, or not to be")["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "To be, or not to be"
    ident = tk.tokenizer_identity(tok)
    assert ident["mask_id"] == tok.mask_token_id and ident["vocab_size"] == tk.EMBEDDED_VOCAB_SIZE
    assert ident["name"] == path.name


def test_training_is_deterministic(tmp_path):
    texts = ["Now is the winter of our discontent " * 50, "Made glorious summer by this sun of York " * 50]
    tk.train_bpe(texts, 400, tmp_path / "a")
    tk.train_bpe(texts, 400, tmp_path / "b")
    a = AutoTokenizer.from_pretrained(str(tmp_path / "a"))
    b = AutoTokenizer.from_pretrained(str(tmp_path / "b"))
    assert tk.vocab_hash(a) == tk.vocab_hash(b)
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()
