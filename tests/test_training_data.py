"""p40lab.training_data: the lab's tiny model and GSM8K-format data, byte for byte stable."""

from __future__ import annotations

import io
import json
import struct
import tarfile

import pyarrow.parquet as pq

from p40fleet.spec import load_spec
from p40fleet.training import data_dir_problems, model_dir_problems
from p40lab import training_data as td


def members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_archives_are_deterministic_and_pinned(tmp_path):
    assert td.archives() == td.archives()
    pins = td.build_training_archives(tmp_path, "http://10.231.0.1:8111")
    mtimes = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    assert td.build_training_archives(tmp_path, "http://10.231.0.1:8111") == pins
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == mtimes  # not rewritten
    spec = load_spec("lab1", {"mirror": {"artifacts_url": "http://10.231.0.1:8111/artifacts"},
                              "training": pins})  # fmt: skip
    assert spec.training_archive_url("model").endswith("/artifacts/" + td.MODEL_ARCHIVE)
    assert spec.training.model.archive.size == (tmp_path / td.MODEL_ARCHIVE).stat().st_size


def test_model_is_a_complete_qwen2_directory():
    files = members(td.archives()[td.MODEL_ARCHIVE])
    names = [n.split("/", 1)[1] for n in files]
    assert all(n.startswith(td.MODEL_NAME + "/") for n in files)
    assert model_dir_problems(names) == []
    config = json.loads(files[f"{td.MODEL_NAME}/config.json"])
    assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"]) == (64, 2)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    tok = json.loads(files[f"{td.MODEL_NAME}/tokenizer.json"])
    assert len(tok["model"]["vocab"]) + len(tok["added_tokens"]) == config["vocab_size"]
    assert config["eos_token_id"] == next(
        t["id"] for t in tok["added_tokens"] if t["content"] == "<|im_end|>"
    )
    # safetensors: header offsets cover the data exactly, shapes as Qwen2 needs them
    blob = files[f"{td.MODEL_NAME}/model.safetensors"]
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + size])
    header.pop("__metadata__")
    assert {k: tuple(v["shape"]) for k, v in header.items()} == td.tensor_shapes(config)
    spans = sorted(v["data_offsets"] for v in header.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(blob) - 8 - size
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert (
        "{% if add_generation_prompt %}"
        in json.loads(files[f"{td.MODEL_NAME}/tokenizer_config.json"])["chat_template"]
    )


def test_data_has_verls_gsm8k_columns(tmp_path):
    files = members(td.archives()[td.DATA_ARCHIVE])
    names = [n.split("/", 1)[1] for n in files]
    assert data_dir_problems(names, td.TRAIN_FILE, td.VAL_FILE) == []
    for name, rows in ((td.TRAIN_FILE, td.TRAIN_ROWS), (td.VAL_FILE, td.VAL_ROWS)):
        path = tmp_path / name
        path.write_bytes(files[f"{td.DATA_NAME}/{name}"])
        table = pq.read_table(path).to_pylist()
        assert len(table) == rows
        row = table[0]
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
        assert row["prompt"][0]["role"] == "user" and '"####"' in row["prompt"][0]["content"]
        assert row["reward_model"]["style"] == "rule"
        # the ground truth is what GSM8K's "#### N" line says
        answer = row["extra_info"]["answer"]
        assert answer.rsplit("#### ", 1)[1] == row["reward_model"]["ground_truth"]


def test_byte_symbols_are_a_printable_bijection():
    symbols = td.byte_symbols()
    assert len(set(symbols)) == 256
    assert all(not s.isspace() and s.isprintable() for s in symbols)
    assert symbols[ord("a")] == "a" and symbols[ord(" ")] == "\u0120"
