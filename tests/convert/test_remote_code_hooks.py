"""`strip_remote_code_hooks`, which every writer of a model directory calls (convert_to_hf and its
sentence-transformers layout, convert_from_hf's carried tokenizer, the kept retriever; the detour through both
converters): what it removes, what it replaces, what it refuses and what it leaves alone. The writers themselves are
tested with a hooked source in tests/convert/test_sentence_transformers_export.py,
tests/eval/test_sentence_transformers_retriever.py and tests/recipes/test_detour_recipe.py."""
import json
import shutil

import pytest
from convert_fixtures import make_tokenizer

from mlmclm.convert.remote_code_hooks import RemoteCodeHookError, strip_remote_code_hooks
from tests.planted_hooks import HOOKS, plant_remote_code_hooks, remote_code_hooks


def _set(path, **values):
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


def test_a_foreign_tokenizer_class_becomes_the_native_one_and_the_tokenizer_still_loads(tmp_path):
    from transformers import AutoTokenizer

    directory = make_tokenizer(tmp_path / "tok")
    native = json.loads((directory / "tokenizer_config.json").read_text())["tokenizer_class"]
    (directory / "config.json").write_text(json.dumps({"model_type": "euro_bert", "tokenizer_class": "EvilTokenizer"}))
    plant_remote_code_hooks(directory)
    assert sorted(strip_remote_code_hooks(directory)) == [
        "config.json: auto_map", "config.json: custom_pipelines", f"config.json: tokenizer_class 'EvilTokenizer' "
        f"(now {native!r})", "special_tokens_map.json: auto_map", "special_tokens_map.json: custom_pipelines",
        "tokenizer_config.json: auto_map", "tokenizer_config.json: custom_pipelines"]
    assert remote_code_hooks(directory) == []
    # the tokenizer's own class foreign too: the class transformers 5 reads any tokenizer.json with
    _set(directory / "tokenizer_config.json", tokenizer_class="EvilTokenizer")
    assert strip_remote_code_hooks(directory) == ["tokenizer_config.json: tokenizer_class 'EvilTokenizer' (now "
                                                  "'TokenizersBackend')"]
    loaded = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
    assert loaded("the cat")["input_ids"] == [0, 5, 6, 1]


def test_no_native_class_for_the_tokenizer_is_refused_naming_the_file(tmp_path):
    directory = tmp_path / "slow"
    directory.mkdir()
    (directory / "vocab.txt").write_text("the\ncat\n")
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "EvilTokenizer"}))
    with pytest.raises(RemoteCodeHookError, match=r"tokenizer_config.json: tokenizer class 'EvilTokenizer' is not "
                                                  r"one transformers ships.*refusing"):
        strip_remote_code_hooks(directory)


def test_token_tables_and_files_without_hooks_are_left_byte_for_byte(tmp_path):
    directory = make_tokenizer(tmp_path / "tok")
    # a vocabulary may hold a token spelled like a hook: it is a token there, not a hook
    (directory / "vocab.json").write_text(json.dumps({"auto_map": 0, "custom_pipelines": 1}))
    (directory / "added_tokens.json").write_text(json.dumps({"auto_map": 2}))
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens":true}')
    before = {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()}
    copy = shutil.copytree(directory, tmp_path / "copy")
    assert strip_remote_code_hooks(directory) == []
    assert {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()} == before
    # a hook in a subfolder's JSON (a sentence-transformers module's config) is found there too
    _set(copy / "1_Pooling" / "config.json", **HOOKS)
    assert strip_remote_code_hooks(copy) == ["1_Pooling/config.json: auto_map",
                                             "1_Pooling/config.json: custom_pipelines"]
