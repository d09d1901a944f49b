"""labctl.mirrors_hf and the checkpoint generator: olah config, tensor shapes, tokenizer ids, chat template.

The generator needs numpy and tokenizers, which live in the lab tools venv (lab/requirements-tools.txt);
its tests run it with that venv's python and are skipped, saying so, when the venv is not built yet.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tomllib
from pathlib import Path

import jinja2.sandbox
import pytest
from labctl import mirrors_hf

LAB_CACHE = Path(os.environ.get("KIMI_LAB_CACHE", "/var/cache/kimi-lab"))


@pytest.fixture(scope="module")
def config() -> dict:
    return json.loads(mirrors_hf.model_config_path().read_text())


def test_olah_config_is_offline_and_serves_the_mirrors(tmp_path):
    text = mirrors_hf.olah_config(tmp_path / "mirrors", "198.18.0.1", 8090, tmp_path / "repos")
    parsed = tomllib.loads(text)
    assert parsed["accessibility"]["offline"] is True
    basic = parsed["basic"]
    assert basic["host"] == "198.18.0.1" and basic["port"] == 8090
    assert basic["mirrors-path"] == [str(tmp_path / "mirrors")]
    assert basic["repos-path"] == str(tmp_path / "repos")
    # Clients get URLs on the address they used, not olah's "localhost" default.
    assert basic["mirror-netloc"] == basic["mirror-lfs-netloc"] == "198.18.0.1:8090"


def test_olah_config_lists_several_mirrors_paths_in_order(tmp_path):
    # The lab's olah serves the miniature and the bulk checkpoints' directory (labctl.mirrors_hf_bulk).
    paths = [tmp_path / "hf" / "mirrors", tmp_path / "hf-bulk" / "mirrors"]
    parsed = tomllib.loads(mirrors_hf.olah_config(paths, "198.18.0.1", 8090, tmp_path / "repos"))
    assert parsed["basic"]["mirrors-path"] == [str(p) for p in paths]


def test_repository_layout_is_what_olah_offline_mode_looks_for(tmp_path):
    assert mirrors_hf.repo_dir(tmp_path) == tmp_path / "models" / "kimi-lab" / "Kimi-K2-mini"
    assert mirrors_hf.REPO_ID == "kimi-lab/Kimi-K2-mini"


def test_expected_tensor_shapes_follow_the_config(config):
    shapes = mirrors_hf.expected_tensor_shapes(config)
    assert shapes["model.embed_tokens.weight"] == [2112, 256]
    assert shapes["lm_head.weight"] == [2112, 256]
    attn = "model.layers.1.self_attn"
    assert shapes[f"{attn}.q_a_proj.weight"] == [128, 256]  # q_lora_rank x hidden
    assert shapes[f"{attn}.q_b_proj.weight"] == [4 * (128 + 64), 128]  # heads x (nope + rope)
    assert shapes[f"{attn}.kv_a_proj_with_mqa.weight"] == [512 + 64, 256]  # kv_lora_rank + rope
    assert shapes[f"{attn}.kv_b_proj.weight"] == [4 * (128 + 128), 512]  # heads x (nope + v)
    assert shapes[f"{attn}.o_proj.weight"] == [256, 4 * 128]
    assert shapes["model.layers.0.mlp.down_proj.weight"] == [256, 512]  # the dense first layer
    assert "model.layers.0.mlp.gate.weight" not in shapes
    assert shapes["model.layers.1.mlp.gate.weight"] == [8, 256]
    assert shapes["model.layers.1.mlp.gate.e_score_correction_bias"] == [8]
    assert shapes["model.layers.1.mlp.experts.7.up_proj.weight"] == [128, 256]
    assert "model.layers.1.mlp.experts.8.up_proj.weight" not in shapes
    assert shapes["model.layers.1.mlp.shared_experts.down_proj.weight"] == [256, 128]
    # Per layer 2 norms + 7 attention tensors; the dense layer 0 has 3 MLP tensors, each MoE layer (1..3) a gate and
    # its bias + 3 x (8 routed + 1 shared).
    assert len(shapes) == 3 + 4 * 9 + 3 + 3 * (2 + 3 * 9)


def test_read_safetensors_header(tmp_path):
    header = {"__metadata__": {"format": "pt"}, "w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}
    encoded = json.dumps(header).encode()
    path = tmp_path / "t.safetensors"
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"\0" * 4)
    assert mirrors_hf.read_safetensors_header(path) == {"w": header["w"]}


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_commit_sha_depends_only_on_the_files(tmp_path):
    shas = []
    for name in ("a", "b"):
        repo = tmp_path / name
        repo.mkdir()
        (repo / "config.json").write_text("{}\n")
        shas.append(mirrors_hf.commit_repository(repo))
    assert shas[0] == shas[1]
    assert len(shas[0]) == 40 and all(c in "0123456789abcdef" for c in shas[0])


# ---------------------------------------------------------------- the generator (needs the tools venv)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    tools_python = mirrors_hf.existing_tools_python(LAB_CACHE)
    if tools_python is None:
        pytest.skip(f"the lab tools venv is not built under {LAB_CACHE} (run `lab/lab up` or mirrors_hf.build)")
    out = tmp_path_factory.mktemp("checkpoint")
    subprocess.run(
        [str(tools_python), str(mirrors_hf.GENERATOR), "--config", str(mirrors_hf.model_config_path()),
         "--out", str(out)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return out


def test_generator_writes_the_checkpoint_files(generated):
    names = {p.name for p in generated.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= names
    assert {"model.safetensors", "README.md", "special_tokens_map.json"} <= names
    assert "no real knowledge" in (generated / "README.md").read_text()


def test_weights_match_the_loaders_names_and_shapes(generated, config):
    header = mirrors_hf.read_safetensors_header(generated / "model.safetensors")
    assert {n: i["shape"] for n, i in header.items()} == mirrors_hf.expected_tensor_shapes(config)
    dtypes = {i["dtype"] for n, i in header.items() if not n.endswith("e_score_correction_bias")}
    assert dtypes == {"BF16"}
    # The file is small but real: data for every tensor, nothing missing at the end.
    end = max(i["data_offsets"][1] for i in header.values())
    (length,) = struct.unpack("<Q", (generated / "model.safetensors").read_bytes()[:8])
    assert (generated / "model.safetensors").stat().st_size == 8 + length + end


def test_tokenizer_has_kimis_special_tokens_at_the_configured_ids(generated, config):
    tokenizer = json.loads((generated / "tokenizer.json").read_text())
    added = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    assert added["[BOS]"] == config["bos_token_id"] == 2048
    assert added["[EOS]"] == config["eos_token_id"] == 2049
    assert added["[PAD]"] == config["pad_token_id"] == 2064
    assert added["<|im_end|>"] == 2050
    for token in ("<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "[EOT]", "[UNK]",
                  "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                  "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>", "</think>"):  # fmt: skip
        assert added[token] >= 2048, token
    assert all(t["special"] for t in tokenizer["added_tokens"])
    assert sorted(added.values()) == list(range(2048, config["vocab_size"]))  # every embedding row has a token
    assert len(tokenizer["model"]["vocab"]) == 2048
    assert tokenizer["model"]["type"] == "BPE"
    generation = json.loads((generated / "generation_config.json").read_text())
    assert generation["eos_token_id"] == added["<|im_end|>"]


def render(generated: Path, **kwargs) -> str:
    template = json.loads((generated / "tokenizer_config.json").read_text())["chat_template"]
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(**kwargs)


def test_chat_template_renders_kimi_turns_tools_and_the_thinking_switch(generated):
    messages = [{"role": "user", "content": "Hi"}]
    off = render(generated, messages=messages, add_generation_prompt=True, thinking=False)
    assert off == (
        "<|im_system|>system<|im_middle|>You are Kimi-K2-mini, a lab miniature with no real knowledge.<|im_end|>"
        "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>"
    )
    on = render(generated, messages=messages, add_generation_prompt=True)
    assert on.endswith("<|im_assistant|>assistant<|im_middle|><think>")  # thinking defaults to on
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    history = [
        *messages,
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
    ]  # fmt: skip
    text = render(generated, messages=history, tools=tools, add_generation_prompt=False)
    declaration = text.split("<|im_end|>", 1)[0]
    assert declaration.startswith("<|im_system|>tool_declare<|im_middle|>[{")
    assert json.loads(declaration.split("<|im_middle|>", 1)[1]) == tools
    assert (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
    ) in text
    assert "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\nsunny<|im_end|>" in text


def test_generator_is_deterministic(generated, tmp_path):
    tools_python = mirrors_hf.existing_tools_python(LAB_CACHE)
    subprocess.run(
        [str(tools_python), str(mirrors_hf.GENERATOR), "--config", str(mirrors_hf.model_config_path()),
         "--out", str(tmp_path)],
        check=True, capture_output=True,
    )  # fmt: skip
    for name in ("tokenizer.json", "model.safetensors", "tokenizer_config.json", "README.md"):
        assert (tmp_path / name).read_bytes() == (generated / name).read_bytes(), name
