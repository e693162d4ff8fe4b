"""A tiny Qwen3 model with random weights and a locally trained tokenizer: real vLLM with no downloads.

`build_tiny_model(dir)` writes a `Qwen3ForCausalLM` checkpoint (hidden 64, 2 layers, 4 heads, 2 KV
heads, head_dim 32: the smallest shape vLLM's CPU attention kernels accept) with `safetensors` +
numpy, and a byte-level BPE tokenizer trained with `tokenizers` on generated text that covers JSON
punctuation and digits. Its chat template opens `<think>` like Qwen3's, so `--reasoning-parser qwen3`
and `thinking_token_budget` work. Random weights rarely emit eos: answers mostly end with `length`.
Deterministic: the same seed gives the same bytes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                  "</tool_call>")
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 64, 2, 4, 2, 32, 128
VOCAB_TARGET = 1024  # BPE vocabulary size; the model's vocabulary is rounded up to a multiple of 64

# Qwen3's template, reduced: system/user/assistant/tool turns, tools in the system turn, and a
# generation prompt that opens <think> (or an empty think block when enable_thinking is false).
CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\nFor each call return <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role != 'system' or not loop.first %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)


def build_tiny_model(directory: str | Path, *, seed: int = 0) -> Path:
    """Write the model into `directory` (created); returns it. About 0.5 MB."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(seed)
    tokenizer.save(str(out / "tokenizer.json"))
    n_tokens = tokenizer.get_vocab_size()
    vocab = -(-n_tokens // 64) * 64
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    _write_weights(out / "model.safetensors", vocab, seed)
    (out / "config.json").write_text(json.dumps(_config(vocab, ids), indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
         "pad_token_id": ids["<|endoftext|>"]}, indent=2))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]), "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE}, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
         "additional_special_tokens": list(SPECIAL_TOKENS[1:])}, indent=2))
    return out


def _config(vocab: int, ids: dict[str, int | None]) -> dict[str, object]:
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": vocab, "hidden_act": "silu",
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
        "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": True,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": LAYERS,
        "initializer_range": 0.02, "torch_dtype": "bfloat16", "use_cache": True,
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
    }


def _write_weights(path: Path, vocab: int, seed: int) -> None:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    # float32 on disk; vLLM casts to --dtype (bfloat16) while loading.
    tensors = {"model.embed_tokens.weight": normal(vocab, HIDDEN), "model.norm.weight": np.ones(HIDDEN, np.float32)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": np.ones(HIDDEN, np.float32),
            p + "post_attention_layernorm.weight": np.ones(HIDDEN, np.float32),
            p + "self_attn.q_proj.weight": normal(HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": normal(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": normal(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": normal(HIDDEN, HEADS * HEAD_DIM),
            p + "self_attn.q_norm.weight": np.ones(HEAD_DIM, np.float32),
            p + "self_attn.k_norm.weight": np.ones(HEAD_DIM, np.float32),
            p + "mlp.gate_proj.weight": normal(INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": normal(INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": normal(HIDDEN, INTERMEDIATE),
        })
    save_file(tensors, str(path), metadata={"format": "pt"})


def _corpus(seed: int, n: int = 3000) -> list[str]:
    """Chat-ish English, JSON objects and numbers: what the suites send and the grammars allow."""
    rng = random.Random(seed)
    words = ["the", "a", "of", "to", "and", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "with", "as", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "word", "but", "what", "some", "we", "can", "out", "other", "were", "all", "there", "when", "up", "use", "your", "how", "said", "an", "each", "she", "which", "do", "their", "time", "if", "will", "way", "about", "many", "then", "them", "write", "would", "like", "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has", "look", "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most", "people", "my", "over", "know", "water", "than", "call", "first", "who", "may", "down", "side", "been", "now", "find", "name", "city", "answer", "yes", "true", "false", "null", "weather", "tool", "function", "arguments", "think", "reason", "step", "json", "schema", "object", "array", "string"]
    lines = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.5:
            lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))).capitalize() + ".")
        elif kind < 0.85:
            obj = {rng.choice(words): rng.choice([rng.randint(-999, 99999), rng.choice(words), True, False, None,
                                                   [rng.randint(0, 9) for _ in range(3)], round(rng.random(), 3)])
                   for _ in range(rng.randint(1, 4))}
            lines.append(json.dumps(obj, separators=rng.choice([(",", ":"), (", ", ": ")])))
        else:
            lines.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(rng.randint(2, 8))))
    return lines


def _train_tokenizer(seed: int) -> Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_TARGET, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    return tok
