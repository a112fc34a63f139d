"""kiln.text against transformers' greedy generate on the same tiny Llama
(crates/kiln-text/tests/fixtures, written by scripts/fixtures/text.py)."""

import json

import pytest
from conftest import TEXT, read_safetensors

from kiln.text import LanguageModel, generate, load


def test_greedy_ids_match_transformers():
    ref = read_safetensors(TEXT / "llama.safetensors")
    model = load(TEXT / "llama")
    prompts = [
        [int(t) for t, m in zip(ids, mask) if m]
        for ids, mask in zip(ref["input_ids"], ref["attention_mask"])
    ]
    new = ref["generated"].shape[1] - ref["input_ids"].shape[1]
    ours = model.generate_ids(prompts, max_new_tokens=new, stop_tokens=[])
    expected = [list(map(int, row[ref["input_ids"].shape[1] :])) for row in ref["generated"]]
    assert ours == expected


def test_text_in_text_out():
    model = LanguageModel(str(TEXT / "llama"))
    out = generate(model, "hello world", max_new_tokens=5)
    assert isinstance(out, str)
    ids = model.generate_ids([model.encode("hello world")], max_new_tokens=5)[0]
    assert out == model.decode(ids)
    batch = generate(model, ["hello world", "a b"], max_new_tokens=5)
    assert batch[0] == out and len(batch) == 2
    sampled = generate(model, "hello", max_new_tokens=5, temperature=0.8, seed=3)
    assert sampled == generate(model, "hello", max_new_tokens=5, temperature=0.8, seed=3)


def test_bad_arguments_are_errors(tmp_path):
    model = load(TEXT / "llama")
    with pytest.raises(ValueError, match="temperature"):
        generate(model, "hello", temperature=-1)
    with pytest.raises(ValueError, match="empty"):
        generate(model, "")
    with pytest.raises(FileNotFoundError):
        generate(tmp_path / "absent", "hello")


def test_unknown_ids_and_broken_configs_are_exceptions(tmp_path):
    model = load(TEXT / "llama")
    with pytest.raises(ValueError, match=r"ids\[1\] = 999999: not a token id"):
        model.decode([1, 999999])
    # A config that passed validation and then divided by zero (head_dim 0) reached Python as
    # pyo3's PanicException, which `except Exception` does not catch: now refused by name.
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in (TEXT / "llama").iterdir():
        (broken / item.name).symlink_to(item)
    config = json.loads((TEXT / "llama" / "config.json").read_text())
    (broken / "config.json").unlink()
    (broken / "config.json").write_text(json.dumps({**config, "head_dim": 0}))
    with pytest.raises(Exception, match="head_dim = 0"):
        load(broken)


def test_text_the_vocabulary_cannot_spell_is_refused(tmp_path):
    # A byte-level vocabulary without `~` (and no unknown token, no byte fallback): the
    # tokenizer would drop the character without a word; kiln names it.
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for item in (TEXT / "llama").iterdir():
        (damaged / item.name).symlink_to(item)
    tokenizer = json.loads((TEXT / "llama" / "tokenizer.json").read_text())
    del tokenizer["model"]["vocab"]["~"]
    (damaged / "tokenizer.json").unlink()
    (damaged / "tokenizer.json").write_text(json.dumps(tokenizer))
    model = LanguageModel(str(damaged))
    with pytest.raises(ValueError, match=r"'~' \(character 3\)"):
        model.encode("a ~ b")
    assert model.encode("a b") == load(TEXT / "llama").encode("a b")
