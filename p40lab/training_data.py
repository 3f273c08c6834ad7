"""The lab's training inputs, made locally (no hub): a tiny model and a GSM8K-format dataset.

``build_training_archives(artifacts_dir, base_url)`` writes two deterministic tar.gz archives
into the mirror's ``artifacts/`` (served at ``mirror.artifacts_url/<filename>``) and returns the
``stack.training`` pins (names, filenames, sha256, sizes) for ``p40lab.sim_stack``:

``p40lab-model-tiny-qwen2.tar.gz``  ``tiny-qwen2/``: a random-weight Qwen2-architecture model
    (hidden 64, 2 layers, 4 heads, 2 KV heads, vocabulary 512, ~0.1 M parameters, float32):
    ``config.json``, ``generation_config.json``, ``model.safetensors`` (written without torch),
    and a byte-level BPE tokenizer trained here on the dataset's own text (``tokenizer.json``,
    ``tokenizer_config.json`` with a ChatML template, ``special_tokens_map.json``).
``p40lab-data-gsm8k-lab.tar.gz``  ``gsm8k-lab/``: ``train.parquet`` (320 rows) and
    ``test.parquet`` (64 rows) with the columns of verl's GSM8K preprocessing (``data_source``
    ``openai/gsm8k`` so verl's GSM8K reward scores it, ``prompt`` [{role, content}],
    ``ability``, ``reward_model`` {style, ground_truth}, ``extra_info``): arithmetic word
    problems generated from templates, answers in GSM8K's ``#### N`` form.

Same inputs, same bytes (fixed seeds, fixed mtimes, gzip without a timestamp): the pinned sums
stay valid across mirror rebuilds, so hosts never fetch them twice. Needs pyarrow (dev extra).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
import re
import struct
import sys
import tarfile
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

MODEL_NAME = "tiny-qwen2"
DATA_NAME = "gsm8k-lab"
MODEL_ARCHIVE = f"p40lab-model-{MODEL_NAME}.tar.gz"
DATA_ARCHIVE = f"p40lab-data-{DATA_NAME}.tar.gz"
TRAIN_FILE, VAL_FILE = "train.parquet", "test.parquet"
TRAIN_ROWS, VAL_ROWS = 320, 64
#: Sequence lengths the lab's spec asks for: the prompts here are < 100 tokens.
MAX_PROMPT_LENGTH, MAX_RESPONSE_LENGTH = 128, 64
VOCAB_SIZE = 512
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
FIXED_MTIME = 1700000000
SEED = 40

ARCH = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}

# verl's examples/data_preprocess/gsm8k.py appends this instruction to every question.
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
# A ChatML template (the Qwen2 chat format): what verl's RLHFDataset applies to ``prompt``.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_NAMES = ("Ada", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jia")
_ITEMS = ("apples", "books", "marbles", "pencils", "stickers", "cookies", "shells", "cards")


# ------------------------------------------------------------------------------ the dataset


def _problem(rng: random.Random) -> tuple[str, str, int]:
    """(question, GSM8K-style worked answer ending in ``#### N``, N)."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(4)
    a, b = rng.randint(2, 60), rng.randint(2, 12)
    if kind == 0:
        q = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
        n, step = a + b, f"{a}+{b}"
    elif kind == 1:
        a += b
        q = f"{name} had {a} {item} and gave away {b}. How many {item} are left?"
        n, step = a - b, f"{a}-{b}"
    elif kind == 2:
        q = f"Each box holds {b} {item}. How many {item} are in {a} boxes?"
        n, step = a * b, f"{a}*{b}"
    else:
        q = f"{name} shares {a * b} {item} equally among {b} friends. How many {item} each?"
        n, step = a, f"{a * b}/{b}"
    return q, f"{name} computes {step}=<<{step}={n}>>{n} {item}.\n#### {n}", n


def dataset_rows(split: str, count: int, seed: int = SEED) -> list[dict[str, Any]]:
    """``count`` rows in verl's GSM8K preprocessing format."""
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for index in range(count):
        question, answer, n = _problem(rng)
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(n)},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "answer": answer,
                    "question": question,
                },
            }
        )
    return rows


def parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf, compression="snappy")
    return buf.getvalue()


# ------------------------------------------------------------------------------ the tokenizer


def byte_symbols() -> list[str]:
    """The byte-level alphabet: byte i -> one printable character (GPT-2's byte-level BPE).

    Printable Latin-1 bytes stand for themselves; the others are shifted to 256 + k, in byte
    order, so no symbol is whitespace or a control character.
    """
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, shifted = [], 0
    for byte in range(256):
        if byte in keep:
            out.append(chr(byte))
        else:
            out.append(chr(256 + shifted))
            shifted += 1
    return out


# Roughly the byte-level pre-tokenizer's split (words, numbers, punctuation runs, spaces):
# merges never cross these boundaries, so training on them yields merges the tokenizer uses.
_PRETOKEN = re.compile(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+")


def train_bpe(texts: list[str], merges: int) -> list[tuple[str, str]]:
    """Up to ``merges`` BPE merges over ``texts`` (most frequent pair first, ties by text)."""
    symbols = byte_symbols()
    words: Counter[tuple[str, ...]] = Counter()
    for text in texts:
        for piece in _PRETOKEN.findall(text):
            words[tuple(symbols[b] for b in piece.encode())] += 1
    out: list[tuple[str, str]] = []
    while len(out) < merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, freq in words.items():
            for pair in zip(word, word[1:], strict=False):
                pairs[pair] += freq
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        out.append(best)
        joined = best[0] + best[1]
        merged: Counter[tuple[str, ...]] = Counter()
        for word, freq in words.items():
            new, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    new.append(joined)
                    i += 2
                else:
                    new.append(word[i])
                    i += 1
            merged[tuple(new)] += freq
        words = merged
    return out


def tokenizer_files(texts: list[str]) -> tuple[dict[str, bytes], dict[str, int]]:
    """The tokenizer's files and the special tokens' ids (vocabulary = :data:`VOCAB_SIZE`)."""
    merges = train_bpe(texts, VOCAB_SIZE - 256 - len(SPECIALS))
    vocab = {s: i for i, s in enumerate(byte_symbols())}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    if len(vocab) + len(SPECIALS) != VOCAB_SIZE:
        # fewer distinct merges than planned: fill with unused symbols so the size holds
        filler = 0x2500
        while len(vocab) + len(SPECIALS) < VOCAB_SIZE:
            vocab.setdefault(chr(filler), len(vocab))
            filler += 1
    special_ids = {token: len(vocab) + i for i, token in enumerate(SPECIALS)}
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": special_ids[t],
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for t in SPECIALS
        ],  # fmt: skip
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": {"type": "ByteLevel", **byte_level, "trim_offsets": False},
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [f"{a} {b}" for a, b in merges],
        },
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(special_ids[t]): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in SPECIALS
        },  # fmt: skip
    }
    special_map = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}  # fmt: skip
    files = {
        "tokenizer.json": _json(tokenizer),
        "tokenizer_config.json": _json(config),
        "special_tokens_map.json": _json(special_map),
    }
    return files, special_ids


# ------------------------------------------------------------------------------ the model


def model_config(special_ids: dict[str, int]) -> dict[str, Any]:
    """A Qwen2 ``config.json`` (the shape of Qwen2.5-0.5B's, scaled down)."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **ARCH,
        "vocab_size": VOCAB_SIZE,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": ARCH["num_hidden_layers"],
        "bos_token_id": special_ids["<|endoftext|>"],
        "eos_token_id": special_ids["<|im_end|>"],
        "torch_dtype": "float32",
        "transformers_version": "4.53.3",
    }


def tensor_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Qwen2ForCausalLM with tied embeddings (q/k/v have biases)."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * (h // config["num_attention_heads"])
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config["vocab_size"], h),
        "model.norm.weight": (h,),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (h, h),
            p + "self_attn.q_proj.bias": (h,),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }
    return shapes


def safetensors_bytes(shapes: dict[str, tuple[int, ...]], seed: int = SEED) -> bytes:
    """Random float32 weights in the safetensors format (norms 1, biases 0, the rest N(0, .02)).

    Format: 8-byte little-endian header length, a JSON header (name -> dtype, shape, byte
    offsets into the data), padded with spaces to 8 bytes, then the tensors back to back.
    """
    rng = random.Random(seed)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name in sorted(shapes):
        shape = shapes[name]
        count = 1
        for dim in shape:
            count *= dim
        if name.endswith("norm.weight"):
            values = array("f", [1.0] * count)
        elif name.endswith(".bias"):
            values = array("f", [0.0] * count)
        else:
            values = array("f", (rng.gauss(0.0, 0.02) for _ in range(count)))
        if sys.byteorder != "little":
            values.byteswap()
        data = values.tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}  # fmt: skip
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


# ------------------------------------------------------------------------------ archives


def _json(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def tar_gz(top: str, files: dict[str, bytes]) -> bytes:
    """A deterministic tar.gz of ``top/`` holding ``files`` (fixed mtime, owner 0, sorted)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(top)
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, FIXED_MTIME
        tar.addfile(info)
        for name in sorted(files):
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode, info.mtime = len(files[name]), 0o644, FIXED_MTIME
            tar.addfile(info, io.BytesIO(files[name]))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def archives() -> dict[str, bytes]:
    """``{filename: tar.gz bytes}`` of the model and the data archives."""
    train, val = dataset_rows("train", TRAIN_ROWS), dataset_rows("test", VAL_ROWS)
    texts = [r["prompt"][0]["content"] + "\n" + r["extra_info"]["answer"] for r in train]
    tok, special_ids = tokenizer_files(texts)
    config = model_config(special_ids)
    generation = {"bos_token_id": config["bos_token_id"], "do_sample": True,
                  "eos_token_id": [special_ids["<|im_end|>"], special_ids["<|endoftext|>"]],
                  "pad_token_id": special_ids["<|endoftext|>"],
                  "transformers_version": "4.53.3"}  # fmt: skip
    model_files = {
        **tok,
        "config.json": _json(config),
        "generation_config.json": _json(generation),
        "model.safetensors": safetensors_bytes(tensor_shapes(config)),
    }
    data_files = {TRAIN_FILE: parquet_bytes(train), VAL_FILE: parquet_bytes(val)}
    return {MODEL_ARCHIVE: tar_gz(MODEL_NAME, model_files),
            DATA_ARCHIVE: tar_gz(DATA_NAME, data_files)}  # fmt: skip


def build_training_archives(artifacts_dir: Path, base_url: str) -> dict[str, Any]:
    """Write the archives into ``artifacts_dir`` (only when their bytes differ) and return the
    ``stack.training`` pins that name them."""
    artifacts_dir = Path(artifacts_dir)
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    pins: dict[str, dict[str, Any]] = {}
    for filename, data in archives().items():
        path = artifacts_dir / filename
        if not path.is_file() or path.read_bytes() != data:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(data)
            tmp.chmod(0o644)
            tmp.replace(path)
        pins[filename] = {
            "filename": filename,
            "url": f"{base_url.rstrip('/')}/artifacts/{filename}",
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
        }
    return {
        "model": {"name": MODEL_NAME, "archive": pins[MODEL_ARCHIVE]},
        "data": {
            "name": DATA_NAME,
            "train_file": TRAIN_FILE,
            "val_file": VAL_FILE,
            "archive": pins[DATA_ARCHIVE],
        },  # fmt: skip
        "max_prompt_length": MAX_PROMPT_LENGTH,
        "max_response_length": MAX_RESPONSE_LENGTH,
    }
