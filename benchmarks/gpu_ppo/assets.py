"""Local inputs of the GPU PPO run: a Qwen2.5-0.5B-shaped config, a tokenizer, GSM8K-format rows.

    python benchmarks/gpu_ppo/assets.py OUTDIR [--train-rows 512] [--val-rows 48]

Writes ``OUTDIR/model/`` (config.json, generation_config.json, tokenizer.json,
tokenizer_config.json, special_tokens_map.json: no weights, the device makes random ones) and
``OUTDIR/data/{train,test}.parquet`` (needs pyarrow; the rest is standard library only).

No hub download: the config values are Qwen2.5-0.5B-Instruct's config.json; the tokenizer is a
word-level one built here with Qwen2's special-token ids (151643..151645) and enough filler
entries that every id below the special tokens decodes, so what a random-weight model generates
turns into text that the GSM8K reward can score. The rows follow verl's
examples/data_preprocess/gsm8k.py (data_source, prompt, ability, reward_model, extra_info).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path
from typing import Any

#: Qwen2.5-0.5B-Instruct's config.json (the values the memory plan is checked against).
QWEN25_05B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

GENERATION_CONFIG: dict[str, Any] = {
    "bos_token_id": 151643,
    "pad_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.1,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
}

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
#: Qwen2's ids for its three special tokens; regular tokens take 0..151642.
SPECIAL_IDS = {ENDOFTEXT: 151643, IM_START: 151644, IM_END: 151645}
UNK = "<unk>"

# Qwen2.5's chat layout (system default, im_start/im_end turns), without its tool branches.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: verl's examples/data_preprocess/gsm8k.py appends this to each question.
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

_NAMES = ("Ann", "Ben", "Carla", "Dev", "Emma", "Femi", "Gus", "Hana")
_THINGS = ("apples", "books", "coins", "pencils", "stamps", "marbles")
_WORD = re.compile(r"\w+|[^\w\s]+")  # what the tokenizer's Whitespace pre-tokenizer splits


def _question(rng: random.Random) -> tuple[str, str, int]:
    """One word problem: (question, worked answer ending in '#### N', N)."""
    name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
    a, b = rng.randint(2, 60), rng.randint(2, 60)
    c = rng.randint(1, a + b - 1)
    total, left = a + b, a + b - c
    question = (
        f"{name} has {a} {thing}. {name} gets {b} more {thing} and then gives {c} {thing} "
        f"away. How many {thing} does {name} have now?"
    )
    answer = f"{name} has {a} + {b} = {total} {thing}. After giving {c} away: {total} - {c} = "
    answer += f"{left}.\n#### {left}"
    return question, answer, left


def gsm8k_rows(count: int, split: str, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` rows in the shape of verl's GSM8K preprocessing (deterministic per seed)."""
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for index in range(count):
        question, answer, solution = _question(rng)
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(solution)},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "answer": answer,
                    "question": question,
                },
            }
        )
    return rows


def vocabulary(texts: list[str], size: int = SPECIAL_IDS[ENDOFTEXT]) -> dict[str, int]:
    """Word-level vocabulary of ``size`` regular tokens: unk, the words of ``texts``, the
    numbers 0..9999, then fillers ``<f N>`` (so every regular id decodes to something)."""
    words: dict[str, None] = {UNK: None}
    for text in texts:
        words.update(dict.fromkeys(_WORD.findall(text)))
    words.update(dict.fromkeys(str(n) for n in range(10000)))
    if len(words) > size:
        raise ValueError(f"{len(words)} words do not fit a vocabulary of {size}")
    vocab = {word: i for i, word in enumerate(words)}
    for i in range(len(vocab), size):
        vocab[f"<f{i}>"] = i
    return vocab


def tokenizer_files(texts: list[str]) -> dict[str, dict[str, Any]]:
    """``{file name: JSON}`` of a fast tokenizer that transformers loads offline."""
    added = [
        {
            "id": token_id,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for token, token_id in SPECIAL_IDS.items()
    ]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocabulary(texts), "unk_token": UNK},
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {
            str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added
        },
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": UNK,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "split_special_tokens": False,
    }
    special = {
        "additional_special_tokens": [IM_START, IM_END],
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": UNK,
    }
    return {
        "tokenizer.json": tokenizer,
        "tokenizer_config.json": config,
        "special_tokens_map.json": special,
    }


def write_model_dir(out: Path, texts: list[str]) -> None:
    """config.json, generation_config.json and the tokenizer files (no weights)."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "config.json": QWEN25_05B_CONFIG,
        "generation_config.json": GENERATION_CONFIG,
        **tokenizer_files(texts),
    }
    for name, body in files.items():
        (out / name).write_text(json.dumps(body, indent=1 if name != "tokenizer.json" else None))


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    """One parquet file of ``rows`` (pyarrow infers the nested list/struct columns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def corpus(rows: list[dict[str, Any]]) -> list[str]:
    """Every text the tokenizer should know: prompts, answers, the chat template's words."""
    texts = ["You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", INSTRUCTION]
    texts += ["system user assistant"]
    for row in rows:
        texts += [m["content"] for m in row["prompt"]] + [row["extra_info"]["answer"]]
    return texts


def build(out: Path, train_rows: int = 512, val_rows: int = 48) -> None:
    """``out/model`` (no weights) and ``out/data/{train,test}.parquet``."""
    train, val = gsm8k_rows(train_rows, "train"), gsm8k_rows(val_rows, "test")
    write_model_dir(out / "model", corpus(train + val))
    write_parquet(train, out / "data" / "train.parquet")
    write_parquet(val, out / "data" / "test.parquet")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--train-rows", type=int, default=512)
    parser.add_argument("--val-rows", type=int, default=48)
    args = parser.parse_args(argv)
    build(args.out, args.train_rows, args.val_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
