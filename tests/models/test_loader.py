"""Loading model folders and tokenizers: clear errors on bad input, exact save/load round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("safetensors")
from safetensors.torch import load_file, save_file  # noqa: E402
from tiny_model import TINY_LAYERS  # noqa: E402

from pearl.errors import CheckpointError, ConfigError  # noqa: E402
from pearl.models.config import SUPPORTED_MODEL_TYPES, ModelConfig  # noqa: E402
from pearl.models.loader import build_model, load_model, load_state_dict, save_model  # noqa: E402

torch.set_num_threads(1)

BASE = {"vocab_size": 96, **TINY_LAYERS}


def make_cfg(model_type: str = "qwen3", **extra) -> ModelConfig:
    return ModelConfig.from_dict({"model_type": model_type, **BASE, **extra})


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A valid single-file Qwen3 folder written by ``save_model``."""
    out = tmp_path / "qwen3"
    save_model(build_model(make_cfg(), seed=1), out)
    return out


def rewrite_weights(folder: Path, edit) -> None:
    path = folder / "model.safetensors"
    state = load_file(str(path))
    edit(state)
    save_file(state, str(path))


def params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# -- config.json --------------------------------------------------------------------------


def test_unknown_model_type_names_it_and_lists_supported(folder: Path) -> None:
    raw = json.loads((folder / "config.json").read_text())
    raw["model_type"] = "mistral"
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as exc:
        load_model(folder)
    msg = str(exc.value)
    assert "'mistral'" in msg and "config.json" in msg
    for supported in SUPPORTED_MODEL_TYPES:
        assert supported in msg


def test_missing_model_type_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="model_type None"):
        ModelConfig.from_dict(dict(BASE))


def test_missing_config_json(folder: Path) -> None:
    (folder / "config.json").unlink()
    with pytest.raises(ConfigError, match="config.json"):
        load_model(folder)


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config.json"):
        load_model(tmp_path / "does-not-exist")


@pytest.mark.parametrize("text", ["{not json", "", '{"model_type": "qwen3",}'])
def test_non_json_config(folder: Path, text: str) -> None:
    (folder / "config.json").write_text(text)
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model(folder)


def test_config_that_is_not_an_object(folder: Path) -> None:
    (folder / "config.json").write_text("[1, 2, 3]")
    with pytest.raises(ConfigError, match="JSON object"):
        load_model(folder)


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("hidden_size", 0, "'hidden_size'"),
        ("vocab_size", "96", "'vocab_size'"),
        ("num_hidden_layers", True, "'num_hidden_layers'"),
        ("num_key_value_heads", 3, "num_key_value_heads 3"),
        ("head_dim", 15, "head_dim 15"),
        ("hidden_act", "gelu", "hidden_act 'gelu'"),
        ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "'yarn'"),
        ("rope_scaling", "llama3", "rope_scaling"),
        (
            "rope_parameters",
            {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
            "'dynamic'",
        ),
    ],
)
def test_invalid_config_fields_are_named(field: str, value, fragment: str) -> None:
    with pytest.raises(ConfigError) as exc:
        ModelConfig.from_dict({"model_type": "llama", **BASE, field: value}, source="cfg.json")
    assert fragment in str(exc.value)
    assert "cfg.json" in str(exc.value)


def test_transformers5_rope_parameters_are_read() -> None:
    """transformers >= 5 writes rope_theta and the scaling under ``rope_parameters``."""
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    cfg = ModelConfig.from_dict({"model_type": "llama", **BASE, "rope_parameters": rope})
    assert cfg.rope_theta == 500000.0
    assert cfg.rope_scaling is not None and cfg.rope_scaling["rope_type"] == "llama3"
    assert cfg.rope_scaling["factor"] == 8.0
    default = ModelConfig.from_dict(
        {
            "model_type": "qwen3",
            **BASE,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        }
    )
    assert default.rope_theta == 1e6 and default.rope_scaling is None
    legacy = ModelConfig.from_dict(
        {"model_type": "qwen3", **BASE, "rope_theta": 1e6, "rope_scaling": None}
    )
    assert legacy.rope_theta == 1e6 and legacy.rope_scaling is None


# -- safetensors --------------------------------------------------------------------------


def test_missing_tensor_is_named(folder: Path) -> None:
    name = "model.layers.1.self_attn.k_norm.weight"
    rewrite_weights(folder, lambda s: s.pop(name))
    with pytest.raises(CheckpointError, match="missing") as exc:
        load_model(folder)
    assert name in str(exc.value)


def test_wrong_shape_names_tensor_and_both_shapes(folder: Path) -> None:
    name = "model.layers.0.mlp.up_proj.weight"  # expected (128, 64)

    def edit(s):
        s[name] = torch.zeros(120, 64)

    rewrite_weights(folder, edit)
    with pytest.raises(CheckpointError) as exc:
        load_model(folder)
    msg = str(exc.value)
    assert name in msg and "(120, 64)" in msg and "(128, 64)" in msg


def test_unexpected_extra_tensor_is_named(folder: Path) -> None:
    def edit(s):
        s["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)  # Qwen3 config says no bias

    rewrite_weights(folder, edit)
    with pytest.raises(CheckpointError, match="unexpected") as exc:
        load_model(folder)
    assert "model.layers.0.self_attn.q_proj.bias" in str(exc.value)


def test_rotary_inv_freq_buffers_are_ignored(folder: Path) -> None:
    """Older HF checkpoints carry ``rotary_emb.inv_freq``; it is not an error."""

    def edit(s):
        s["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)

    rewrite_weights(folder, edit)
    load_model(folder)


def test_folder_without_safetensors(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        load_model(folder)


def test_corrupt_safetensors_file(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage!")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(folder)


def shard(folder: Path) -> dict[str, str]:
    """Split ``model.safetensors`` into two shards plus an index; return the weight map."""
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(state)
    parts = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    weight_map = {}
    for file, part in parts.items():
        save_file({n: state[n] for n in part}, str(folder / file))
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return weight_map


def test_sharded_folder_loads_like_single_file(folder: Path) -> None:
    expected = params(load_model(folder))
    shard(folder)
    got = params(load_model(folder))
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_index_listing_a_missing_shard(folder: Path) -> None:
    shard(folder)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError) as exc:
        load_model(folder)
    msg = str(exc.value)
    assert "model-00002-of-00002.safetensors" in msg and "model.safetensors.index.json" in msg
    assert "model-00001-of-00002" not in msg


def test_index_naming_only_some_shards_reports_missing_tensors(folder: Path) -> None:
    """Only the shards the index lists are read: tensors of an unlisted shard are missing."""
    weight_map = shard(folder)
    only_first = {n: f for n, f in weight_map.items() if f.startswith("model-00001")}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": only_first}))
    with pytest.raises(CheckpointError, match="missing") as exc:
        load_model(folder)
    second = sorted(n for n, f in weight_map.items() if f.startswith("model-00002"))
    assert second[0] in str(exc.value)


# -- load_state_dict is all-or-nothing --------------------------------------------------------


@pytest.mark.parametrize("defect", ["wrong_shape", "missing", "unexpected", "nan", "inf"])
def test_failed_load_state_dict_leaves_weights_unchanged(defect: str) -> None:
    model = build_model(make_cfg(), seed=1)
    before = params(model)
    new = {n: torch.randn_like(p) for n, p in before.items()}  # every tensor different
    last = list(new)[-1]  # a defect at the end, after everything else would have been copied
    if defect == "wrong_shape":
        new[last] = torch.zeros(new[last].shape[0] + 1, *new[last].shape[1:])
    elif defect == "missing":
        del new[last]
    elif defect in ("nan", "inf"):
        new[last].view(-1)[3] = float(defect)
    else:
        new["model.layers.2.mlp.up_proj.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointError) as exc:
        load_state_dict(model, new)
    if defect in ("nan", "inf"):
        assert "1 non-finite values" in str(exc.value) and last in str(exc.value)
    after = params(model)
    for name in before:
        assert torch.equal(after[name], before[name]), name


def test_load_state_dict_copies_everything() -> None:
    model = build_model(make_cfg(), seed=1)
    donor = build_model(make_cfg(), seed=2)
    load_state_dict(model, dict(donor.named_parameters()))
    for (name, p), q in zip(model.named_parameters(), donor.parameters(), strict=True):
        assert torch.equal(p, q), name


# -- save_model / load_model round trip ----------------------------------------------------------


ROUND_TRIP = {
    "qwen3": dict(model_type="qwen3", head_dim=32, rope_theta=1e6, eos_token_id=[3, 5]),
    "qwen3_tied": dict(
        model_type="qwen3", tie_word_embeddings=True, rms_norm_eps=1e-5, eos_token_id=7
    ),
    "llama3_bias": dict(
        model_type="llama",
        attention_bias=True,
        rope_theta=5e5,
        max_position_embeddings=256,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
}


@pytest.mark.parametrize("case", list(ROUND_TRIP))
def test_save_then_load_round_trips_exactly(tmp_path: Path, case: str) -> None:
    cfg = make_cfg(**ROUND_TRIP[case])
    model = build_model(cfg, seed=3)
    with torch.no_grad():  # non-trivial norms and biases, not just build_model's ones/zeros
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    save_model(model, tmp_path / case)
    loaded = load_model(tmp_path / case)
    assert type(loaded) is type(model)
    assert loaded.config == cfg
    before, after = params(model), params(loaded)
    assert before.keys() == after.keys()
    for name in before:
        assert after[name].dtype == torch.float32
        assert torch.equal(after[name], before[name]), name
    if cfg.tie_word_embeddings:
        assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
        assert "lm_head.weight" not in dict(loaded.named_parameters())
    if cfg.attention_bias:
        assert loaded.model.layers[0].self_attn.o_proj.bias is not None
    # num_parameters agrees with the module (tied embeddings counted once).
    assert cfg.num_parameters() == sum(p.numel() for p in loaded.parameters())


# -- tokenizer ----------------------------------------------------------------------------------


tokenizers = pytest.importorskip("tokenizers")

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Agents call tools, read results, and think again.",
    "Rollouts interleave prefill and decode on shared workers!",
    "Numbers 0123456789 and café, naïve, 東京.",
]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_tokenizer_round_trip(tokenizer_file: Path) -> None:
    from pearl.models.tokenizer import Tokenizer

    from_file = Tokenizer(tokenizer_file)
    from_folder = Tokenizer(tokenizer_file.parent)
    assert 256 < from_file.vocab_size <= 400
    for text in CORPUS + ["unseen words: zebra quantum 🙂", " leading and trailing spaces  "]:
        ids = from_file.encode(text)
        assert ids and all(isinstance(i, int) and 0 <= i < from_file.vocab_size for i in ids)
        assert from_folder.encode(text) == ids
        assert from_file.decode(ids) == text
    # Merges learnt from the corpus make seen text shorter than its bytes.
    assert len(from_file.encode(CORPUS[0])) < len(CORPUS[0].encode())
    eot = from_file.token_id("<|endoftext|>")
    assert eot is not None and from_file.decode([eot]) == "<|endoftext|>"
    assert from_file.token_id("definitely-not-a-token") is None


@pytest.mark.parametrize("content", ["{not json", '{"model": {"type": "NoSuchModel"}}', "[]"])
def test_malformed_tokenizer_json(tmp_path: Path, content: str) -> None:
    from pearl.models.tokenizer import Tokenizer

    path = tmp_path / "tokenizer.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match="not a valid tokenizer.json") as exc:
        Tokenizer(path)
    assert str(path) in str(exc.value)
    with pytest.raises(ConfigError, match="not a valid tokenizer.json"):
        Tokenizer(tmp_path)  # the folder form finds the same file


def test_missing_tokenizer_json(tmp_path: Path) -> None:
    from pearl.models.tokenizer import Tokenizer

    with pytest.raises(ConfigError, match="tokenizer.json not found"):
        Tokenizer(tmp_path)


def test_one_parse_serves_engine_and_simulator_with_clear_limits():
    """The engine refuses what its decoder cannot run (MoE); the simulator reads it. Null
    optional fields count as absent, integral floats as integers."""
    moe = {
        "model_type": "qwen3_moe",
        **BASE,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
    }
    with pytest.raises(ConfigError, match="model_type 'qwen3_moe' is not supported"):
        ModelConfig.from_dict(moe)
    with pytest.raises(ConfigError, match="mixture-of-experts.*simulator only"):
        ModelConfig.from_dict({**moe, "model_type": "qwen3"})
    parsed = ModelConfig.from_dict(moe, for_engine=False)
    assert (parsed.num_experts, parsed.moe_intermediate_size) == (8, 32)
    dense = ModelConfig.from_dict(
        {"model_type": "qwen3", **BASE, "num_experts": None, "max_position_embeddings": 2048.0}
    )
    assert dense.num_experts == 0 and dense.max_position_embeddings == 2048
    assert ModelConfig.from_dict({"model_type": "qwen3", **BASE}).context_limit == 4096
