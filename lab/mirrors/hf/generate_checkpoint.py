"""Generate the lab's miniature Kimi-K2-shaped checkpoint (run with the lab tools venv's python).

    python generate_checkpoint.py --config tiny-kimi-k2-config.json --out DIR

Writes config.json, tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json,
model.safetensors and README.md into DIR. Everything is deterministic: the tokenizer is trained on a fixed
slice of this Python's standard library, the weights come from a seeded generator, files are written with
sorted keys. See lab/mirrors/README.md for the weight construction (the constant channel and the lm_head
logit bias that make replies end within tens of tokens).
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sysconfig
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = Path(__file__).resolve().parent
REGULAR_VOCAB = 2048
SEED = 20260101
CORPUS_BYTES = 3_000_000

# Kimi's special tokens at ids 2048+, in Kimi K2's own order (offsets from its first special id) where they
# fit; [PAD] sits at 2064 because the reference config says so, [UNK] takes the last id; the free slots are
# reserved tokens so that every row of the embedding has a token.
SPECIAL_TOKENS = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "[EOT]",
    10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>",
    16: "[PAD]",
    17: "<|im_middle|>",
    22: "<think>",
    23: "</think>",
}
UNK = "[UNK]"

# ------------------------------------------------------------------ weight construction (see README.md)
BIAS_CHANNEL = 0  # constant in every token's embedding, untouched by every layer: lm_head reads a bias off it
FLAG_CHANNEL = 1  # set on tokens after which a reply must not stop yet (<|im_middle|>, <think>, </think>)
BIAS_VALUE = 1.0
FLAG_VALUE = 1.0
CONTENT_STD = 0.05  # embedding entries of the other channels
LAYER_OUT_STD = 0.004  # o_proj / down_proj: small, so a token's next-token logits depend mostly on itself
INIT_STD = 0.02
RANDOM_LOGIT_STD = 1.5  # spread of the content part of the logits
BANNED_LOGIT = -30.0
TEMPERATURE = 0.6  # generation_config default; the stop bias is tuned for it
TARGET_STOP_PROBABILITY = 0.06  # per step, for <|im_end|> and for </think>: replies of ~10-20 tokens


def special_token_table(vocab_size: int) -> dict[int, str]:
    free = vocab_size - REGULAR_VOCAB
    table = {}
    for offset in range(free):
        table[REGULAR_VOCAB + offset] = SPECIAL_TOKENS.get(offset, f"<|reserved_token_{offset}|>")
    table[vocab_size - 1] = UNK
    return table


# ------------------------------------------------------------------------------------------- tokenizer


def corpus_chunks() -> list[str]:
    """A fixed slice of the standard library (sorted file names) plus chat- and JSON-shaped text."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        chunks.append(text)
        total += len(text)
        if total >= CORPUS_BYTES:
            break
    chunks.append(
        "\n".join(
            f'{{"name": "get_weather", "arguments": {{"city": "City {i}", "unit": "celsius", "days": {i % 7}}}}}'
            for i in range(500)
        )
    )
    return chunks


def train_tokenizer(config: dict) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=REGULAR_VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_chunks(), trainer)
    if tokenizer.get_vocab_size() != REGULAR_VOCAB:
        raise SystemExit(f"trained {tokenizer.get_vocab_size()} regular tokens, expected {REGULAR_VOCAB}")
    table = special_token_table(config["vocab_size"])
    tokenizer.add_special_tokens([AddedToken(table[i], special=True, normalized=False) for i in sorted(table)])
    for token_id, token in table.items():
        if tokenizer.token_to_id(token) != token_id:
            raise SystemExit(f"{token} got id {tokenizer.token_to_id(token)}, expected {token_id}")
    for key, token in (("bos_token_id", "[BOS]"), ("eos_token_id", "[EOS]"), ("pad_token_id", "[PAD]")):
        if tokenizer.token_to_id(token) != config[key]:
            raise SystemExit(f"config {key}={config[key]} but {token} has id {tokenizer.token_to_id(token)}")
    return tokenizer


def tokenizer_config(table: dict[int, str], chat_template: str) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": UNK,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "added_tokens_decoder": {
            str(i): {
                "content": token,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
                "special": True,
            }
            for i, token in sorted(table.items())
        },
        "chat_template": chat_template,
    }


# --------------------------------------------------------------------------------------------- weights


def to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


class WeightBuilder:
    def __init__(self, config: dict) -> None:
        self.config = config
        self.rng = np.random.default_rng(SEED)
        self.tensors: dict[str, np.ndarray] = {}

    def normal(self, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
        self.tensors[name] = self.rng.normal(0.0, std, size=shape).astype(np.float32)
        return self.tensors[name]

    def ones(self, name: str, size: int) -> np.ndarray:
        self.tensors[name] = np.ones(size, dtype=np.float32)
        return self.tensors[name]

    def residual_norm(self, name: str) -> None:
        """Layer input norms ignore the bias and flag channels: the layers see only token content."""
        weight = self.ones(name, self.config["hidden_size"])
        weight[[BIAS_CHANNEL, FLAG_CHANNEL]] = 0.0

    def output_projection(self, name: str, shape: tuple[int, int]) -> None:
        """A projection that writes into the residual stream must leave the bias and flag channels alone."""
        weight = self.normal(name, shape, LAYER_OUT_STD)
        weight[[BIAS_CHANNEL, FLAG_CHANNEL], :] = 0.0

    def mlp(self, prefix: str, intermediate: int) -> None:
        hidden = self.config["hidden_size"]
        self.normal(f"{prefix}.gate_proj.weight", (intermediate, hidden), INIT_STD)
        self.normal(f"{prefix}.up_proj.weight", (intermediate, hidden), INIT_STD)
        self.output_projection(f"{prefix}.down_proj.weight", (hidden, intermediate))

    def attention(self, prefix: str) -> None:
        c = self.config
        heads, hidden = c["num_attention_heads"], c["hidden_size"]
        qk_head = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        self.normal(f"{prefix}.q_a_proj.weight", (c["q_lora_rank"], hidden), INIT_STD)
        self.ones(f"{prefix}.q_a_layernorm.weight", c["q_lora_rank"])
        self.normal(f"{prefix}.q_b_proj.weight", (heads * qk_head, c["q_lora_rank"]), INIT_STD)
        kv_a_rows = c["kv_lora_rank"] + c["qk_rope_head_dim"]
        self.normal(f"{prefix}.kv_a_proj_with_mqa.weight", (kv_a_rows, hidden), INIT_STD)
        self.ones(f"{prefix}.kv_a_layernorm.weight", c["kv_lora_rank"])
        kv_b_rows = heads * (c["qk_nope_head_dim"] + c["v_head_dim"])
        self.normal(f"{prefix}.kv_b_proj.weight", (kv_b_rows, c["kv_lora_rank"]), INIT_STD)
        self.output_projection(f"{prefix}.o_proj.weight", (hidden, heads * c["v_head_dim"]))

    def layers(self) -> None:
        c = self.config
        for layer in range(c["num_hidden_layers"]):
            prefix = f"model.layers.{layer}"
            self.residual_norm(f"{prefix}.input_layernorm.weight")
            self.residual_norm(f"{prefix}.post_attention_layernorm.weight")
            self.attention(f"{prefix}.self_attn")
            moe = layer >= c["first_k_dense_replace"] and layer % c["moe_layer_freq"] == 0
            if not moe:
                self.mlp(f"{prefix}.mlp", c["intermediate_size"])
                continue
            self.normal(f"{prefix}.mlp.gate.weight", (c["n_routed_experts"], c["hidden_size"]), INIT_STD)
            self.tensors[f"{prefix}.mlp.gate.e_score_correction_bias"] = np.zeros(
                c["n_routed_experts"], dtype=np.float32
            )
            for expert in range(c["n_routed_experts"]):
                self.mlp(f"{prefix}.mlp.experts.{expert}", c["moe_intermediate_size"])
            self.mlp(f"{prefix}.mlp.shared_experts", c["moe_intermediate_size"] * c["n_shared_experts"])

    def embeddings(self, flagged: list[int]) -> np.ndarray:
        c = self.config
        embed = self.normal("model.embed_tokens.weight", (c["vocab_size"], c["hidden_size"]), CONTENT_STD)
        embed[:, BIAS_CHANNEL] = BIAS_VALUE
        embed[:, FLAG_CHANNEL] = 0.0
        embed[flagged, FLAG_CHANNEL] = FLAG_VALUE
        self.ones("model.norm.weight", c["hidden_size"])
        return embed


def final_hidden(embed: np.ndarray, eps: float) -> np.ndarray:
    """What the final norm makes of each token's embedding alone (the layers' small share left out)."""
    rms = np.sqrt(np.mean(embed * embed, axis=1, keepdims=True) + eps)
    return embed / rms


def stop_probabilities(logits: np.ndarray, stop_ids: list[int], rows: np.ndarray) -> np.ndarray:
    scaled = logits[rows] / TEMPERATURE
    scaled -= scaled.max(axis=1, keepdims=True)
    probs = np.exp(scaled)
    probs /= probs.sum(axis=1, keepdims=True)
    return probs[:, stop_ids]


def build_lm_head(
    builder: WeightBuilder, tokenizer: Tokenizer, table: dict[int, str], flagged: list[int]
) -> dict[str, float]:
    """lm_head = random content part + a bias read off the constant channel + bans read off the flag channel.

    The stop bias is found by bisection so that, at the default temperature, a token ends the reply with
    probability TARGET_STOP_PROBABILITY per step on average (estimated on each token's own embedding).
    """
    c = builder.config
    vocab, hidden = c["vocab_size"], c["hidden_size"]
    embed = from_bf16(to_bf16(builder.tensors["model.embed_tokens.weight"]))
    h = final_hidden(embed, c["rms_norm_eps"])
    content_scale = float(np.sqrt(np.mean(h[:, 2:] ** 2)))
    head = builder.normal("lm_head.weight", (vocab, hidden), RANDOM_LOGIT_STD / (content_scale * np.sqrt(hidden - 2)))
    bias_scale = float(np.median(h[:, BIAS_CHANNEL]))  # what the bias channel reads after the final norm

    im_end, think_end = tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("</think>")
    whitespace_only = [i for i in range(REGULAR_VOCAB) if tokenizer.decode([i]).strip() == ""]
    bias = np.zeros(vocab, dtype=np.float32)
    bias[whitespace_only] = BANNED_LOGIT
    bias[[i for i in table if i not in (im_end, think_end)]] = BANNED_LOGIT
    head[:, FLAG_CHANNEL] = 0.0
    head[[im_end, think_end], FLAG_CHANNEL] = BANNED_LOGIT / float(np.median(h[flagged, FLAG_CHANNEL]))

    content_rows = np.array([i for i in range(REGULAR_VOCAB) if i not in set(whitespace_only)])
    low, high = 0.0, 30.0
    for _ in range(40):
        stop_bias = (low + high) / 2
        bias[[im_end, think_end]] = stop_bias
        head[:, BIAS_CHANNEL] = bias / bias_scale
        logits = h @ from_bf16(to_bf16(head)).T
        mean_stop = float(stop_probabilities(logits, [im_end], content_rows).mean())
        low, high = (stop_bias, high) if mean_stop < TARGET_STOP_PROBABILITY else (low, stop_bias)

    logits = h @ from_bf16(to_bf16(head)).T
    greedy = logits.argmax(axis=1)
    flagged_next = logits[flagged].argmax(axis=1)
    return {
        "stop_bias": round(stop_bias, 3),
        "mean_stop_probability_im_end": round(float(stop_probabilities(logits, [im_end], content_rows).mean()), 4),
        "mean_stop_probability_think_end": round(
            float(stop_probabilities(logits, [think_end], content_rows).mean()), 4
        ),
        "greedy_stops_after_fraction_of_tokens": round(float(np.isin(greedy[content_rows], [im_end]).mean()), 4),
        "flagged_tokens_never_stop_next": bool(not np.isin(flagged_next, [im_end, think_end]).any()),
        "whitespace_only_tokens_banned": len(whitespace_only),
    }


def write_safetensors(tensors: dict[str, np.ndarray], path: Path, keep_float32: set[str]) -> None:
    """A safetensors file (8-byte header length, JSON header, raw little-endian data), tensors sorted by name."""
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        if name in keep_float32:
            data, dtype = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes(), "F32"
        else:
            data, dtype = to_bf16(tensors[name]).astype("<u2").tobytes(), "BF16"
        header[name] = {
            "dtype": dtype,
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    encoded += b" " * (-len(encoded) % 8)
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for blob in blobs:
            handle.write(blob)


# ------------------------------------------------------------------------------------------------ main


def write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def check_chat_template(tokenizer_config_path: Path) -> None:
    """Render the template once with a tool call in the history: a broken template fails the build here."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    template = json.loads(tokenizer_config_path.read_text())["chat_template"]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "functions.get_weather:0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
    ]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    for thinking in (True, False):
        text = env.from_string(template).render(
            messages=messages, tools=tools, add_generation_prompt=True, thinking=thinking
        )
        expected_end = "<think>" if thinking else "<think></think>"
        if not text.endswith("<|im_assistant|>assistant<|im_middle|>" + expected_end):
            raise SystemExit(f"chat template renders an unexpected ending (thinking={thinking}): {text[-80:]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads(args.config.read_text())

    shutil.copyfile(args.config, out / "config.json")
    tokenizer = train_tokenizer(config)
    tokenizer.save(str(out / "tokenizer.json"))
    table = special_token_table(config["vocab_size"])
    chat_template = (HERE / "chat_template.jinja").read_text()
    write_json(out / "tokenizer_config.json", tokenizer_config(table, chat_template))
    write_json(
        out / "special_tokens_map.json",
        {"bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": UNK},
    )
    write_json(
        out / "generation_config.json",
        {
            "bos_token_id": config["bos_token_id"],
            # Replies end at <|im_end|>, like Kimi K2's own generation config.
            "eos_token_id": tokenizer.token_to_id("<|im_end|>"),
            "pad_token_id": config["pad_token_id"],
            "do_sample": True,
            "temperature": TEMPERATURE,
            "top_p": 1.0,
            "max_length": config["max_position_embeddings"],
        },
    )
    check_chat_template(out / "tokenizer_config.json")

    builder = WeightBuilder(config)
    flagged = [tokenizer.token_to_id(t) for t in ("<|im_middle|>", "<think>", "</think>")]
    builder.embeddings(flagged)
    builder.layers()
    stats = build_lm_head(builder, tokenizer, table, flagged)
    write_safetensors(
        builder.tensors,
        out / "model.safetensors",
        keep_float32={n for n in builder.tensors if n.endswith("e_score_correction_bias")},
    )
    readme = (HERE / "README.md.in").read_text()
    (out / "README.md").write_text(readme.replace("@STATS@", json.dumps(stats, indent=2, sort_keys=True)))
    print(json.dumps(stats, sort_keys=True))


if __name__ == "__main__":
    main()
