#!/usr/bin/env python3
"""The bad-input matrix of `foundry`: every case runs one command on a copy of shared fixtures
(a tiny prepared dataset, a second one with another tokenizer, a tiny trained run with its
checkpoint, a run config, a hardware profile) after damaging or replacing some input, and
expects

  1. exit code 1 (FAILED), or a command-line parse error (USAGE: 2, or CLI11's own code);
  2. an `error: ` line naming the input (each `expect` substring is in the error text) and a
     `hint: ` line (USAGE: CLI11's message naming the option instead);
  3. the case's working tree unchanged: the same files with the same SHA-256, no new files or
     directories.

    bad_input.py FOUNDRY SOURCE_DIR [NAME_SUBSTRING...]

A case is one line of CASES below: Case(name, command line (after `foundry`, split like a
shell), setup steps run in the case directory before the snapshot, expected substrings).
"""
import concurrent.futures
import ctypes
import ctypes.util
import hashlib
import json
import os
import random
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time

FAILED, USAGE = "failed", "usage"
CK = "run/checkpoints/step_00000002"  # the fixture run's checkpoint (format 2)
TIMEOUT_S = 120


class Case:
    def __init__(self, name, argv, setup=(), expect=(), code=FAILED, hint=""):
        self.name, self.argv, self.setup = name, shlex.split(argv), list(setup)
        self.expect, self.code, self.hint = list(expect), code, hint


# ---- checksums (XXH3-64, as every Foundry file uses) -------------------------------------------

_xxhash = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
_xxhash.XXH3_64bits.restype = ctypes.c_uint64
_xxhash.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3(data):
    return _xxhash.XXH3_64bits(bytes(data), len(data))


# ---- setup steps: each returns a function of the case directory ------------------------------

def _path(root, rel):
    return os.path.join(root, rel)


def write(rel, text):
    def step(root):
        os.makedirs(os.path.dirname(_path(root, rel)) or root, exist_ok=True)
        with open(_path(root, rel), "wb") as f:
            f.write(text.encode() if isinstance(text, str) else text)
    return step


def copy(src, dst):
    return lambda root: shutil.copyfile(_path(root, src), _path(root, dst))


def remove(rel):
    return lambda root: os.remove(_path(root, rel))


def remove_tree(rel):
    return lambda root: shutil.rmtree(_path(root, rel))


def remove_committed():
    """Every checkpoint of the run without its commit marker (saves that never finished)."""
    def step(root):
        base = os.path.join(root, "run", "checkpoints")
        for name in os.listdir(base):
            marker = os.path.join(base, name, "COMMITTED")
            if os.path.exists(marker):
                os.remove(marker)
        if os.path.exists(os.path.join(base, "latest")):
            os.remove(os.path.join(base, "latest"))
    return step


def mkdir(rel):
    return lambda root: os.makedirs(_path(root, rel))


def mkfifo(rel):
    def step(root):
        os.makedirs(os.path.dirname(_path(root, rel)), exist_ok=True)
        os.mkfifo(_path(root, rel))
    return step


def _walk_key(obj, key):
    """The container of a dotted key ("a.b.0.c") and its last part."""
    parts = key.split(".")
    for p in parts[:-1]:
        obj = obj[int(p)] if isinstance(obj, list) else obj[p]
    last = parts[-1]
    return obj, int(last) if isinstance(obj, list) else last


def edit_json(rel, key, value=None, delete=False):
    def step(root):
        path = _path(root, rel)
        doc = json.load(open(path))
        parent, last = _walk_key(doc, key)
        if delete:
            del parent[last]
        elif callable(value):
            parent[last] = value(parent[last])
        else:
            parent[last] = value
        with open(path, "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
    return step


def flip(rel, offset):
    """Flips bits of the byte at `offset` (negative: from the end; callable: of the root)."""
    def step(root):
        path = _path(root, rel)
        at = offset(root) if callable(offset) else offset
        with open(path, "r+b") as f:
            f.seek(at, os.SEEK_SET if at >= 0 else os.SEEK_END)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0x40]))
    return step


def truncate(rel, drop):
    return lambda root: os.truncate(_path(root, rel), os.path.getsize(_path(root, rel)) - drop)


def append(rel, data):
    def step(root):
        with open(_path(root, rel), "ab") as f:
            f.write(data)
    return step


def resign(ckpt=CK):
    """Rewrites COMMITTED with the checksum of the (edited) metadata.json."""
    def step(root):
        meta = open(_path(root, ckpt + "/metadata.json"), "rb").read()
        with open(_path(root, ckpt + "/COMMITTED"), "w") as f:
            json.dump({"format_version": 2, "metadata_xxh3_64": "%016x" % xxh3(meta)}, f)
    return step


SHARD_FIELDS = {"format_version": (8, "<I"), "token_bytes": (12, "<I"), "token_count": (16, "<Q"),
                "vocab_size": (24, "<I")}


def _reseal_shard(b):
    struct.pack_into("<Q", b, 40, xxh3(b[64:]))
    struct.pack_into("<Q", b, 56, xxh3(b[:56]))


def shard_header(rel, field, value):
    """Sets a header field of a token shard, with valid checksums."""
    def step(root):
        b = bytearray(open(_path(root, rel), "rb").read())
        at, fmt = SHARD_FIELDS[field]
        struct.pack_into(fmt, b, at, value)
        _reseal_shard(b)
        open(_path(root, rel), "wb").write(b)
    return step


def shard_token(rel, index, token):
    """Sets token `index` of a 2-byte token shard, with valid checksums."""
    def step(root):
        b = bytearray(open(_path(root, rel), "rb").read())
        struct.pack_into("<H", b, 64 + 2 * index, token)
        _reseal_shard(b)
        open(_path(root, rel), "wb").write(b)
    return step


def piece_offset(tensor, ckpt=CK):
    """The byte in the middle of `tensor`'s first piece in its rank file."""
    def at(root):
        meta = json.load(open(_path(root, ckpt + "/metadata.json")))
        p = next(p for p in meta["pieces"] if p["tensor"] == tensor)
        return p["byte_offset"] + p["byte_length"] // 2
    return at


def dataset_with_other_tokens(src, dst):
    """A copy of dataset `src` whose first train token differs, with valid checksums: the same
    tokenizer and window count, other tokens."""
    def step(root):
        shutil.copytree(_path(root, src), _path(root, dst))
        shard = dst + "/train_00000.bin"
        b = bytearray(open(_path(root, shard), "rb").read())
        struct.pack_into("<H", b, 64, (struct.unpack_from("<H", b, 64)[0] + 1) % 300)
        _reseal_shard(b)
        open(_path(root, shard), "wb").write(b)
        meta = json.load(open(_path(root, dst + "/meta.json")))
        meta["splits"]["train"]["shards"][0]["checksum"] = "%016x" % struct.unpack_from("<Q", b, 40)[0]
        with open(_path(root, dst + "/meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
    return step


EMBED = "model.embed_tokens.weight"
BAD_PROFILE = "profile.json"  # a copy of the fixture profile, damaged by each case


# ---- the matrix ---------------------------------------------------------------------------------

CASES = [
    # -- run configs: files, sections, keys, values, overrides --
    Case("config: missing file", "model info --config nope.json", [], ["nope.json"]),
    Case("config: invalid JSON", "train -c bad.json", [write("bad.json", '{"model": {"d_model": 32,}')], ["bad.json:1:"]),
    Case("config: not an object", "model info --config list.json", [write("list.json", "[1, 2]")], ["list.json", "JSON object"]),
    Case("config: section not an object", "model info --config tiny.json", [edit_json("tiny.json", "model", 5)], ["tiny.json", "'model' must be a JSON object"]),
    Case("config: a section twice", "train -c t.json", [write("t.json", '{"model": {"vocab_size": 300, "max_seq_len": 32}, "train": {"steps": 2}, "train": {"lr": 0.01}}')], ["t.json", "'train' appears twice"], hint="merge the two"),
    Case("config: a key twice", "model info --config t.json", [write("t.json", '{"model": {"vocab_size": 300, "d_model": 32, "d_model": 64, "max_seq_len": 32}}')], ["t.json", "'model.d_model' appears twice"]),
    Case("config: unknown section", "train -c tiny.json", [edit_json("tiny.json", "trian", {})], ["unknown key 'trian'"], hint="known keys"),
    Case("config: micro_batch_size not dividing a rank's share", "train -c tiny.json --synthetic-data --set train.batch_size=6 train.micro_batch_size=4", [], ["train.micro_batch_size = 4 does not divide a rank's 6 sequences"], hint="divides 6"),
    Case("config: micro_batch_size not dividing eval's batch", "eval -c tiny.json --set train.batch_size=6 train.micro_batch_size=4", [], ["train.micro_batch_size = 4 does not divide the 6 sequences of a batch eval runs"], hint="divides 6"),
    Case("config: micro_batch_size not dividing model info's batch", "model info --config tiny.json --batch 6 --set train.micro_batch_size=4", [], ["train.micro_batch_size = 4 does not divide the 6 sequences of the batch (--batch)"], hint="divides 6"),
    Case("config: micro_batch_size not dividing model info --dp's share", "model info --config tiny.json --batch 12 --dp 2 --set train.micro_batch_size=4", [], ["train.micro_batch_size = 4 does not divide a rank's 6 sequences of the batch (12 over --dp 2)"], hint="divides 6"),
    Case("config: micro_batch_size not dividing plan --config's share", "plan --profile profile.json --config tiny.json --devices 2 --global-batch 12 --set train.micro_batch_size=4", [], ["train.micro_batch_size = 4 does not divide each device's 6 sequences"], hint="divides 6"),
    Case("config: micro_batch_size negative", "train -c tiny.json --synthetic-data --set train.micro_batch_size=-1", [], ["train.micro_batch_size"]),
    Case("config: a misspelled section named before the defaults' checks", "train -c t.json", [write("t.json", '{"model": {"vocab_size": 300, "max_seq_len": 32}, "trian": {"steps": 2}}')], ["unknown key 'trian'"], hint="known keys"),
    Case("config: unknown key in the file", "train -c tiny.json", [edit_json("tiny.json", "model.d_modle", 3)], ["tiny.json", "model.d_modle"]),
    Case("config: string for a number", "train -c tiny.json --set 'train.lr=\"fast\"'", [], ["train.lr", "must be a number"]),
    Case("config: fraction for an integer", "model info --config tiny.json --set model.d_model=32.5", [], ["model.d_model", "integer"]),
    Case("config: vocab_size below range", "model info --config tiny.json --set model.vocab_size=1", [], ["model.vocab_size", "out of range"]),
    Case("config: batch_size 0", "train -c tiny.json --set train.batch_size=0", [], ["train.batch_size", "out of range"]),
    Case("config: negative lr", "train -c tiny.json --set train.lr=-0.1", [], ["train.lr", "-0.1"]),
    Case("config: beta2 above 1", "train -c tiny.json --set train.beta2=1.5", [], ["train.beta2"]),
    Case("config: negative grad_clip", "train -c tiny.json --set train.grad_clip=-1", [], ["train.grad_clip"]),
    Case("config: muon_ns_steps too large", "train -c tiny.json --set train.muon_ns_steps=1000", [], ["train.muon_ns_steps"]),
    Case("option: model info --cp with chunks shorter than the CCA's halo", "model info --config tiny.json --set model.arch=zaya1 model.top_k=1 --cp 8 --seq 16", [], ["context parallel 8 cuts sequences of 16 tokens into chunks of 1", "CCA"], hint="fewer context-parallel ranks"),
    Case("config: muon_ns_steps 0, refused before training", "model info --config tiny.json --set train.optimizer=muon train.muon_ns_steps=0", [], ["train.muon_ns_steps"]),
    Case("config: muon_rms_scale 0, refused before training", "model info --config tiny.json --set train.optimizer=muon train.muon_rms_scale=0", [], ["train.muon_rms_scale = 0 must be positive"], hint="0.2"),
    Case("config: log_every 0", "train -c tiny.json --set train.log_every=0", [], ["train.log_every"]),
    Case("config: unknown arch", "model info --config tiny.json --set model.arch=gpt", [], ["model.arch", "gpt"]),
    Case("config: unknown optimizer", "train -c tiny.json --set train.optimizer=sgd", [], ["train.optimizer", "sgd"]),
    Case("config: unknown schedule", "train -c tiny.json --set train.schedule=linear", [], ["train.schedule", "linear"]),
    Case("config: unknown precision", "train -c tiny.json --set train.precision=fp8", [], ["train.precision", "fp8"]),
    Case("config: unknown checkpoint_overlap", "train -c tiny.json --set train.checkpoint_overlap=never", [], ["train.checkpoint_overlap", "never"]),
    Case("config: seq_len beyond max_seq_len", "train -c tiny.json --set train.seq_len=64", [], ["train.seq_len = 64", "model.max_seq_len"]),
    Case("config: heads not a multiple of kv heads", "model info --config tiny.json --set model.n_kv_heads=3", [], ["model.n_kv_heads = 3"]),
    Case("config: odd head_dim", "model info --config tiny.json --set model.head_dim=7", [], ["model.head_dim = 7"]),
    Case("config: top_k above n_experts", "model info --config tiny.json --set model.top_k=5", [], ["model.top_k = 5"]),
    Case("config: odd rotary dims", "model info --config tiny.json --set model.rope_fraction=0.375", [], ["model.rope_fraction"]),
    Case("config: rotary dims not a whole number", "train -c tiny.json --overwrite --set model.rope_fraction=0.3", [], ["model.rope_fraction = 0.3 of head_dim 8 gives 2.4 rotary dims"], hint="0.25 for 2 dims"),
    Case("config: zaya1 key on arch moe", "model info --config tiny.json --set model.router_eda=false", [], ["model.router_eda", "zaya1"]),
    Case("config: zaya1 with one expert", "model info --config tiny.json --set model.arch=zaya1 --set model.n_experts=1 --set model.top_k=1", [], ["model.n_experts = 1"]),
    Case("config: untied embeddings", "model info --config tiny.json --set model.tie_embeddings=false", [], ["model.tie_embeddings"]),
    Case("config: expert_parallel without MPI", "train -c tiny.json --set train.expert_parallel=2", [], ["train.expert_parallel = 2"]),
    Case("override: a string that reads as a number", "train -c tiny.json --set train.run_dir=2024", [], ["'train.run_dir' must be a string, got 2024"], hint="""--set 'train.run_dir="2024"'"""),
    Case("override: no '='", "train -c tiny.json --set train.lr", [], ["train.lr", "key=value"]),
    Case("override: unknown section", "train -c tiny.json --set trian.lr=1", [], ["trian.lr"]),
    Case("override: key below a value", "train -c tiny.json --set train.lr.max=1", [], ["train.lr.max", "not an object"]),
    Case("config: empty data.dir (train)", "train -c tiny.json --set data.dir=", [], ["data.dir"], hint="--synthetic-data"),
    Case("config: empty data.dir (eval)", "eval -c tiny.json --set data.dir=", [], ["data.dir"]),
    Case("config: data.dir does not exist", "train -c tiny.json --set data.dir=nowhere", [], ["nowhere", "does not exist"]),

    # -- command-line options out of range --
    Case("option: unknown command", "size --config tiny.json", [], ["unknown command 'size'"], hint="the commands are data, model, train", code=USAGE),
    Case("option: unknown option", "train -c tiny.json --bogus", [], ["--bogus"], code=USAGE),
    Case("option: train --steps negative", "train -c tiny.json --steps -3", [], ["--steps", "-3"], code=USAGE),
    Case("option: data prepare --shard-tokens negative", "data prepare --input corpus.txt --out ds2 --shard-tokens -5000", [], ["--shard-tokens", "-5000 is not in range"], code=USAGE),
    Case("option: generate --seed negative", "generate -c tiny.json -p x --seed -1", [], ["--seed", "'-1' is not a whole number"], code=USAGE),
    Case("config: a negative seed", "train -c tiny.json --set train.seed=-1", [], ["train.seed", "-1 is out of range"]),
    Case("option: train --steps not a number", "train -c tiny.json --steps many", [], ["--steps", "many"], code=USAGE),
    Case("option: train --stop-at-step 0", "train -c tiny.json --stop-at-step 0", [], ["--stop-at-step", "not in range 1 to"], code=USAGE),
    Case("option: eval --batches negative", "eval -c tiny.json --batches -1", [], ["--batches", "-1"], code=USAGE),
    Case("option: missing --config", "train --steps 2", [], ["--config"], code=USAGE),
    Case("option: generate --top-p above 1", "generate -c tiny.json -p hi --top-p 1.5", [], ["--top-p"], code=USAGE),
    Case("option: generate --temperature negative", "generate -c tiny.json -p hi --temperature -1", [], ["--temperature"], code=USAGE),
    Case("option: generate --max-new-tokens 0", "generate -c tiny.json -p hi --max-new-tokens 0", [], ["--max-new-tokens"], code=USAGE),
    Case("option: generate --top-k negative", "generate -c tiny.json -p hi --top-k -2", [], ["--top-k"], code=USAGE),
    Case("option: generate with neither --prompt nor --batch", "generate -c tiny.json", [], ["--prompt", "--batch"]),
    Case("option: generate --prompt and --batch", "generate -c tiny.json -p hi --batch req.jsonl --out o.jsonl", [write("req.jsonl", '{"prompt": "hi"}\n')], ["not both"]),
    Case("option: generate --batch without --out", "generate -c tiny.json --batch req.jsonl", [write("req.jsonl", '{"prompt": "hi"}\n')], ["--out"]),
    Case("option: generate --out is the --batch file", "generate -c tiny.json --batch req.jsonl --out req.jsonl", [write("req.jsonl", '{"prompt": "hi"}\n')], ["req.jsonl", "the --batch file"]),
    Case("batch: requests file missing", "generate -c tiny.json --batch nope.jsonl --out o.jsonl", [], ["nope.jsonl"]),
    Case("batch: requests file with no requests", "generate -c tiny.json --batch req.jsonl --out o.jsonl", [write("req.jsonl", "\n\n")], ["req.jsonl", "no requests"]),
    Case("batch: --out holds something else", "generate -c tiny.json --batch req.jsonl --out notes.txt", [write("req.jsonl", '{"prompt": "hi"}\n'), write("notes.txt", "my notes\n")], ["notes.txt", "line 1"], hint="another --out"),
    Case("batch: --out holds another input's results", "generate -c tiny.json --batch req.jsonl --out o.jsonl", [write("req.jsonl", '{"prompt": "hi"}\n'), write("o.jsonl", '{"index": 0, "text": "x", "token_ids": [1], "request": "0000000000000001"}\n')], ["o.jsonl", "another request"]),
    Case("batch: --kv-memory too small for a request", "generate -c tiny.json --batch req.jsonl --out o.jsonl --kv-memory 1K", [write("req.jsonl", '{"prompt": "hi"}\n')], ["request 0 (line 1)", "KV budget"], hint="--kv-memory"),
    Case("option: generate --kv-memory not a size", "generate -c tiny.json --batch req.jsonl --out o.jsonl --kv-memory lots", [write("req.jsonl", '{"prompt": "hi"}\n')], ["--kv-memory", "lots"]),
    Case("option: generate --schedule unknown", "generate -c tiny.json --batch req.jsonl --out o.jsonl --schedule fifo", [write("req.jsonl", '{"prompt": "hi"}\n')], ["--schedule", "fifo"], hint="prefix-tree"),
    Case("option: generate --trace is the --out file", "generate -c tiny.json --batch req.jsonl --out o.jsonl --trace o.jsonl", [write("req.jsonl", '{"prompt": "hi"}\n')], ["--trace", "o.jsonl", "--out"]),
    Case("option: generate --trace is the new --out file, spelled otherwise", "generate -c tiny.json --batch req.jsonl --out o.jsonl --trace ./o.jsonl", [write("req.jsonl", '{"prompt": "hi"}\n')], ["--trace './o.jsonl' is the --out file"]),
    Case("option: generate -q with one --prompt", "generate -c tiny.json -p hi -q", [], ["--quiet", "--batch"], code=USAGE),
    Case("option: eval -q without --choices", "eval -c tiny.json -q", [], ["--quiet", "--choices"], code=USAGE),
    Case("option: generate --trace in a missing directory", "generate -c tiny.json --batch req.jsonl --out o.jsonl --trace nodir/t.tsv", [write("req.jsonl", '{"prompt": "hi"}\n')], ["--trace", "nodir/t.tsv"]),
    Case("option: generate --max-requests 0", "generate -c tiny.json --batch req.jsonl --out o.jsonl --max-requests 0", [write("req.jsonl", '{"prompt": "hi"}\n')], ["--max-requests"], code=USAGE),
    Case("batch: ignore_eos not a boolean", "generate -c tiny.json --batch req.jsonl --out o.jsonl --stop-on-error", [write("req.jsonl", '{"prompt": "hi", "ignore_eos": "yes"}\n')], ["line 1", "ignore_eos"], hint="--stop-on-error"),
    Case("option: generate --batch-tokens 0", "generate -c tiny.json --batch req.jsonl --out o.jsonl --batch-tokens 0", [write("req.jsonl", '{"prompt": "hi"}\n')], ["--batch-tokens"], code=USAGE),
    Case("choices: --choices file missing", "eval -c tiny.json --choices nope.jsonl", [], ["nope.jsonl"]),
    Case("choices: --choices file with no items", "eval -c tiny.json --choices c.jsonl", [write("c.jsonl", "\n")], ["c.jsonl", "no items"]),
    Case("batch: no valid request (another run's results as the requests)", "generate -c tiny.json --batch res.jsonl --out o.jsonl", [write("res.jsonl", '{"index": 0, "text": "a", "token_ids": [1]}\n{"index": 1, "text": "b", "token_ids": [2]}\n')], ["none of the 2 requests", "res.jsonl", "line 1"], hint="nothing would run"),
    Case("choices: no valid item", "eval -c tiny.json --choices c.jsonl --out s.jsonl", [write("c.jsonl", '{"context": "a", "choices": ["b"]}\n{"prompt": "a"}\n')], ["none of the 2 items", "c.jsonl", "line 1"], hint="nothing would be scored"),
    Case("choices: --out is the --choices file", "eval -c tiny.json --choices c.jsonl --out c.jsonl", [write("c.jsonl", '{"context": "a", "choices": ["b", "c"]}\n')], ["c.jsonl", "the --choices file"]),
    Case("choices: on a GPU that is not there", "eval -c tiny.json --choices c.jsonl --device cuda:99", [write("c.jsonl", '{"context": "a", "choices": ["b", "c"]}\n')], ["train.device cuda:99"]),
    Case("generate: on a GPU that is not there", "generate -c tiny.json -p hi --device cuda:99", [], ["train.device cuda:99"]),
    Case("generate: --device gpu", "generate -c tiny.json -p hi --device gpu", [], ["train.device 'gpu'"], hint="cuda:N"),
    Case("batch: --stop-on-error with an invalid line", "generate -c tiny.json --batch req.jsonl --out o.jsonl --stop-on-error", [write("req.jsonl", '{"prompt": "hi"}\n{"prompt": "x", "top_k": -1}\n')], ["line 2", "top_k"], hint="--stop-on-error"),
    Case("option: model info --optimizer unknown", "model info --config tiny.json --optimizer sgd", [], ["--optimizer"], code=USAGE),
    Case("option: model info --batch 0", "model info --config tiny.json --batch 0", [], ["--batch 0"]),
    Case("option: model info --dp that --batch does not divide", "model info --config tiny.json --dp 3 --batch 4", [], ["--batch 4 sequences cannot be split evenly over 3 data-parallel ranks"], hint="multiple of 3"),
    Case("option: model info --dp not a multiple of --cp", "model info --config tiny.json --dp 3 --cp 2 --batch 6", [], ["--dp 3 ranks cannot form context-parallel groups of 2 (--cp)"]),
    Case("option: model info --seq beyond max_seq_len", "model info --config tiny.json --seq 64", [], ["--seq 64", "model.max_seq_len"]),
    Case("option: model info --dp 0", "model info --config tiny.json --dp 0", [], ["--dp 0"]),
    Case("option: model info --ep not dividing --dp", "model info --config tiny.json --dp 4 --ep 3", [], ["--ep 3", "--dp 4"]),
    Case("option: prepare the same input twice", "data prepare --input corpus.txt --input ./corpus.txt --out new", [], ["input './corpus.txt' is the file 'corpus.txt' already read"]),
    Case("option: prepare --val-fraction 0.9", "data prepare --input corpus.txt --out new --val-fraction 0.9", [], ["--val-fraction 0.9"]),
    Case("option: prepare --vocab-size 0", "data prepare --input corpus.txt --out new --vocab-size 0", [], ["--vocab-size 0"]),
    Case("option: prepare --shard-tokens 0", "data prepare --input corpus.txt --out new --shard-tokens 0", [], ["--shard-tokens", "0 is not in range"], code=USAGE),
    Case("count: prepare --shard-tokens that makes more shards than a reader can map", "data prepare --input big.txt --out ds --overwrite --vocab-size 300 --shard-tokens 1", [lambda root: write("big.txt", corpus(WORDS, 3, 600))(root)], ["train split needs more than 16384 shards of --shard-tokens 1"], hint="larger --shard-tokens"),
    Case("option: prepare --max-sentences 0", "data prepare --input corpus.txt --out new --max-sentences 0", [], ["--max-sentences 0"]),
    Case("option: prepare --format unknown", "data prepare --input corpus.txt --out new --format xml", [], ["'xml'"]),
    Case("option: prepare --jsonl-field empty", "data prepare --input corpus.txt --out new --jsonl-field ''", [], ["--jsonl-field"]),
    Case("option: plan without --profile", "plan --total-params 1M", [], ["--profile"]),
    Case("option: plan --tolerance 2", "plan --profile profile.json --total-params 6M --active-params 2M --tolerance 2", [], ["--tolerance 2"]),
    Case("option: plan --comm-overlap 2", "plan --profile profile.json --total-params 6M --active-params 2M --comm-overlap 2", [], ["--comm-overlap 2"]),
    Case("option: plan --scatter 0.5", "plan --profile profile.json --total-params 6M --active-params 2M --scatter 0.5", [], ["--scatter 0.5"]),
    Case("option: plan --total-params not a number", "plan --profile profile.json --total-params lots", [], ["--total-params 'lots'"]),
    Case("option: plan --aspect-ratio one value", "plan --profile profile.json --total-params 6M --aspect-ratio 5", [], ["--aspect-ratio '5'"]),
    Case("option: plan --global-batch not a multiple", "plan --profile profile.json --config tiny.json --devices 4 --global-batch 6", [], ["--global-batch 6", "--devices 4"]),
    Case("config: plan --config's train.expert_parallel beyond the devices", "plan --profile profile.json --config tiny.json --devices 2 --set train.expert_parallel=4", [], ["train.expert_parallel = 4 does not divide the 2 devices"]),
    Case("count: plan --config's global batch not a multiple of the devices", "plan --profile profile.json --config tiny.json --devices 4", [], ["train.batch_size = 2 (the global batch of tiny.json)", "--devices 4"], hint="multiple of 4"),
    Case("option: plan --micro-batch not dividing a device's share", "plan --profile profile.json --config tiny.json --global-batch 8 --micro-batch 3", [], ["--micro-batch 3", "each device's 8 sequences"]),
    Case("option: plan --global-batch 0", "plan --profile profile.json --config tiny.json --global-batch 0", [], ["--global-batch", "not in range 1 to"], code=USAGE),
    Case("option: plan --micro-batch in a search", "plan --profile profile.json --total-params 6M --micro-batch 2", [], ["--micro-batch is for --config"]),
    Case("option: plan --precision with --config", "plan --profile profile.json --config tiny.json --precision fp32", [], ["--precision", "train.precision"], hint="--set train.precision="),
    Case("option: plan --optimizer with --config", "plan --profile profile.json --config tiny.json --optimizer muon", [], ["--optimizer", "train.optimizer"], hint="--set train.optimizer="),
    Case("option: plan --devices 0", "plan --profile profile.json --total-params 6M --devices 0", [], ["--devices", "not in range 1 to"], code=USAGE),
    Case("option: plan --top 0", "plan --profile profile.json --total-params 6M --top 0", [], ["--top", "not in range 1 to"], code=USAGE),
    Case("config: train.device gpu", "train -c tiny.json --synthetic-data --set train.device=gpu", [], ["train.device 'gpu'"], hint="cuda:N"),
    Case("option: train --device cuda:x", "train -c tiny.json --synthetic-data --device cuda:x", [], ["train.device 'cuda:x'"]),
    Case("option: train on a GPU that is not there", "train -c tiny.json --synthetic-data --device cuda:99", [], ["train.device cuda:99"]),
    Case("option: eval --device gpu", "eval -c tiny.json --device gpu", [], ["train.device 'gpu'"], hint="cuda:N"),
    Case("option: eval on a GPU that is not there", "eval -c tiny.json --device cuda:99", [], ["train.device cuda:99"]),
    Case("option: bench gemm --device gpu", "bench gemm --quick --device gpu", [], ["--device 'gpu'"], hint="cuda:N"),
    Case("option: bench membw --device cuda:x", "bench membw --quick --device cuda:x", [], ["--device 'cuda:x'"]),
    Case("option: bench decode on a GPU that is not there", "bench decode --config tiny.json --device cuda:99", [], ["--device cuda:99"]),
    Case("option: bench membw with more threads than CPUs", "bench membw --quick --threads 4096", [], ["bench membw --threads 4096: this process may run on", "would use 4096 threads"], hint="--threads counts up to the CPUs"),
    Case("option: bench gemm on a GPU that is not there", "bench gemm --quick --device cuda:99 --profile profile.json", [], ["--device cuda:99"]),
    Case("option: bench membw --threads with --device cuda", "bench membw --quick --device cuda --threads 2", [], ["--threads", "--device cuda:0"]),
    Case("option: bench gemm --peak-clock-ghz with --device cuda", "bench gemm --quick --device cuda --peak-clock-ghz 2", [], ["--peak-clock-ghz", "--device cuda:0"]),
    Case("option: bench gemm --top-k without the expert sweep", "bench gemm --quick --kinds square --top-k 1", [], ["--top-k shapes the expert sweep", "--kinds square"], hint="add expert to --kinds, or drop --top-k"),
    Case("option: bench gemm --sizes without the square sweep", "bench gemm --quick --kinds decode,offsize --sizes 64", [], ["--sizes shapes the square sweep", "--kinds decode,offsize"], hint="add square to --kinds"),
    Case("option: bench membw --min-bytes with --no-working-set", "bench membw --quick --no-working-set --min-bytes 1M", [], ["--min-bytes shapes the working-set sweep", "--no-working-set"], hint="drop --min-bytes or --no-working-set"),
    Case("option: bench membw --array-bytes with --no-stream", "bench membw --quick --no-stream --array-bytes 8M", [], ["--array-bytes", "--no-stream skips STREAM"]),
    Case("option: bench decode --finer with --widths", "bench decode --config tiny.json --widths 4x64x2 --finer 2", [], ["--finer", "--widths"], hint="drop one of them"),
    Case("option: bench all --only unknown", "bench all --out bench-out --only gemm,disk", [], ["'disk'"]),
    Case("option: bench all --only without gemm and nothing to merge", "bench all --quick --out bench-out --only membw", [], ["--only 'membw' measures no GEMMs"], hint="add gemm"),

    # -- data prepare inputs --
    Case("prepare: input missing", "data prepare --input nope.txt --out new", [], ["nope.txt"]),
    Case("prepare: broken JSONL line", "data prepare --input bad.jsonl --out new --vocab-size 300",
         [write("bad.jsonl", '{"text": "a line"}\n{"text": "broken\n')], ["bad.jsonl:2"]),
    Case("prepare: JSONL line without the field", "data prepare --input bad.jsonl --out new --vocab-size 300",
         [write("bad.jsonl", '{"text": "a line"}\n{"body": "no text field"}\n')], ["bad.jsonl:2", "text"]),
    Case("prepare: JSON array not closed", "data prepare --input bad.json --out new --vocab-size 300",
         [write("bad.json", '["one document", "another"')], ["bad.json"]),
    Case("prepare: only blank text", "data prepare --input blank.txt --out new", [write("blank.txt", "\n  \n\n")], ["blank.txt", "no text"]),
    Case("prepare: vocabulary too small for the corpus", "data prepare --input corpus.txt --out new --vocab-size 50 --quiet", [], ["vocabulary size 50"], hint="--vocab-size"),
    Case("prepare: --out holds other files", "data prepare --input corpus.txt --out notes", [write("notes/todo.txt", "keep me")], ["'notes'", "todo.txt"]),
    Case("prepare: --out holds a dataset", "data prepare --input corpus.txt --out ds", [], ["'ds' already holds a prepared dataset"], hint="--overwrite"),
    Case("prepare: --out holds a tokenizer.model of the user's", "data prepare --input corpus.txt --out tokdir --vocab-size 300", [write("tokdir/tokenizer.model", "mine")], ["'tokdir' holds tokenizer.model but no meta.json"], hint="--tokenizer"),
    Case("prepare: --out is a file", "data prepare --input corpus.txt --out tiny.json", [], ["tiny.json", "not a directory"]),
    Case("prepare: --tokenizer missing", "data prepare --input corpus.txt --out new --tokenizer nope.model", [], ["nope.model"]),
    Case("prepare: --tokenizer not a tokenizer", "data prepare --input corpus.txt --out new --tokenizer junk.model", [write("junk.model", "not a model")], ["junk.model"]),
    Case("prepare: binary input", "data prepare --input random.bin --out new --vocab-size 300",
         [write("random.bin", random.Random(5).randbytes(200000))], ["random.bin", "is not text", "NUL"], hint="--allow-binary"),

    # -- datasets: meta.json, tokenizer.model, token shards --
    Case("dataset: no meta.json", "train -c tiny.json", [remove("ds/meta.json")], ["'ds' is not a prepared dataset"]),
    Case("dataset: meta.json invalid JSON", "train -c tiny.json", [write("ds/meta.json", '{"format": ')], ["ds/meta.json:1:"]),
    Case("dataset: meta.json not an object", "eval -c tiny.json", [write("ds/meta.json", "[]")], ["ds/meta.json"]),
    Case("dataset: meta.json unknown key", "train -c tiny.json", [edit_json("ds/meta.json", "shuffle", True)], ["ds/meta.json", "unknown key 'shuffle'"]),
    Case("dataset: meta.json missing key", "train -c tiny.json", [edit_json("ds/meta.json", "vocab_size", delete=True)], ["ds/meta.json", "'vocab_size'"]),
    Case("dataset: meta.json wrong type", "train -c tiny.json", [edit_json("ds/meta.json", "vocab_size", "300")], ["ds/meta.json", "'vocab_size'"]),
    Case("dataset: meta.json other format", "train -c tiny.json", [edit_json("ds/meta.json", "format", "parquet")], ["ds/meta.json", "parquet"]),
    Case("dataset: meta.json format_version 2", "train -c tiny.json", [edit_json("ds/meta.json", "format_version", 2)], ["ds/meta.json", "version 2"]),
    Case("dataset: meta.json vocab and token width", "train -c tiny.json", [edit_json("ds/meta.json", "token_bytes", 4)], ["ds/meta.json", "token_bytes 4"]),
    Case("dataset: meta.json separator", "train -c tiny.json", [edit_json("ds/meta.json", "document_separator", "newline")], ["ds/meta.json", "newline"]),
    Case("dataset: meta.json tokenizer file", "train -c tiny.json", [edit_json("ds/meta.json", "tokenizer.file", "other.model")], ["ds/meta.json", "tokenizer.file", "other.model"]),
    Case("dataset: meta.json checksum not hex", "train -c tiny.json", [edit_json("ds/meta.json", "tokenizer.checksum", "xyz")], ["ds/meta.json", "tokenizer.checksum"]),
    Case("dataset: meta.json split totals", "train -c tiny.json", [edit_json("ds/meta.json", "splits.train.tokens", lambda n: n + 1)], ["ds/meta.json", "split 'train'"]),
    Case("dataset: meta.json shard outside the directory", "train -c tiny.json", [edit_json("ds/meta.json", "splits.val.shards.0.file", "../val_00000.bin")], ["ds/meta.json", "../val_00000.bin"]),
    Case("dataset: meta.json sources not a list", "train -c tiny.json", [edit_json("ds/meta.json", "sources", {})], ["ds/meta.json", "'sources'"]),
    Case("dataset: tokenizer.model replaced", "train -c tiny.json", [copy("ds_other/tokenizer.model", "ds/tokenizer.model")], ["ds/tokenizer.model", "checksum"]),
    Case("dataset: tokenizer.model missing", "eval -c tiny.json", [remove("ds/tokenizer.model")], ["tokenizer.model"]),
    Case("dataset: shard missing", "train -c tiny.json", [remove("ds/train_00000.bin")], ["train_00000.bin", "missing"]),
    Case("dataset: shard truncated", "train -c tiny.json", [truncate("ds/train_00000.bin", 3)], ["ds/train_00000.bin", "truncated"]),
    Case("dataset: shard with trailing data", "train -c tiny.json", [append("ds/train_00000.bin", b"\0\0")], ["ds/train_00000.bin", "trailing data"]),
    Case("dataset: shard magic", "train -c tiny.json", [flip("ds/train_00000.bin", 0)], ["ds/train_00000.bin", "bad magic"]),
    Case("dataset: shard header flipped", "train -c tiny.json", [flip("ds/train_00000.bin", 17)], ["ds/train_00000.bin", "header checksum"]),
    Case("dataset: shard data flipped", "eval -c tiny.json", [flip("ds/val_00000.bin", 70)], ["ds/val_00000.bin", "checksum"]),
    Case("dataset: shard format version", "train -c tiny.json", [shard_header("ds/train_00000.bin", "format_version", 2)], ["ds/train_00000.bin", "format version 2"]),
    Case("dataset: shard token width", "train -c tiny.json", [shard_header("ds/train_00000.bin", "token_bytes", 3)], ["ds/train_00000.bin", "token width 3"]),
    Case("dataset: shard token outside the vocabulary", "train -c tiny.json", [shard_token("ds/train_00000.bin", 5, 310)], ["ds/train_00000.bin", "token 310 at position 5"]),
    Case("dataset: shard of another dataset", "train -c tiny.json", [copy("ds_other/train_00000.bin", "ds/train_00000.bin")], ["ds/train_00000.bin", "tokenizer"]),
    Case("dataset: shard does not match meta.json", "train -c tiny.json", [copy("ds/val_00000.bin", "ds/train_00000.bin")], ["ds/train_00000.bin", "meta.json"]),
    Case("dataset: vocabulary vs model.vocab_size", "train -c tiny.json --set model.vocab_size=320", [], ["vocabulary size 300", "model.vocab_size = 320"], hint="--set model.vocab_size=300"),
    Case("dataset: train split shorter than a window", "train -c tiny.json --set model.max_seq_len=100000 --set train.seq_len=90000", [], ["'train' split of dataset 'ds'", "seq_len + 1 = 90001"]),
    Case("dataset: eval of a dataset without a validation split", "eval -c tiny.json --set data.dir=ds_noval", [], ["'val' split of dataset 'ds_noval'", "0 tokens", "seq_len + 1 = 17"], hint="--val-fraction"),

    # -- tokenizers --
    Case("tokenizer: generate --tokenizer missing", "generate -c tiny.json -p hi --tokenizer nope.model", [], ["nope.model"]),
    Case("tokenizer: generate --tokenizer not a tokenizer", "generate -c tiny.json -p hi --tokenizer junk.model", [write("junk.model", b"\x08\x01junk")], ["junk.model"]),
    Case("tokenizer: generate --tokenizer of another vocabulary", "generate -c tiny.json -p hi --tokenizer vocab350.model", [], ["vocab350.model", "350", "model.vocab_size = 300"]),
    Case("tokenizer: generate without a dataset or --tokenizer", "generate -c tiny.json -p hi --set data.dir=", [], ["data.dir"], hint="--tokenizer"),
    Case("tokenizer: resume with another tokenizer", "train -c tiny.json --resume --steps 4 --set data.dir=ds_other", [], [CK, "ds_other"], hint="tokenizer"),
    Case("tokenizer: eval with another dataset of the same vocabulary", "eval -c tiny.json --set data.dir=ds_other", [], [CK, "ds_other"], hint="tokenizer"),
    Case("tokenizer: generate with another dataset's tokenizer", "generate -c tiny.json -p hi --tokenizer ds_other/tokenizer.model", [], [CK, "ds_other/tokenizer.model"], hint="tokenizer"),
    Case("tokenizer: generate --tokenizer is a dataset's meta.json", "generate -c tiny.json -p hi --tokenizer ds/meta.json", [], ["ds/meta.json", "not a valid SentencePiece"]),

    # -- checkpoints (format 2) --
    Case("checkpoint: ckpt info of a missing directory", "ckpt info nothing/here", [], ["'nothing/here' does not exist"]),
    Case("checkpoint: ckpt info of a file", "ckpt info tiny.json", [], ["'tiny.json' is not a directory"]),
    Case("checkpoint: ckpt verify of a run directory", "ckpt verify run", [], ["'run' is not a Foundry checkpoint"], hint=CK),
    Case("checkpoint: eval --checkpoint missing", "eval -c tiny.json --checkpoint run/checkpoints/step_00000009", [], ["step_00000009"]),
    Case("checkpoint: no COMMITTED", "eval -c tiny.json --checkpoint " + CK, [remove(CK + "/COMMITTED")], [CK, "COMMITTED"]),
    Case("checkpoint: COMMITTED invalid JSON", "ckpt verify " + CK, [write(CK + "/COMMITTED", "{")], [CK + "/COMMITTED"]),
    Case("checkpoint: metadata.json edited", "eval -c tiny.json --checkpoint " + CK, [edit_json(CK + "/metadata.json", "step", 3)], [CK + "/metadata.json", "checksum"]),
    Case("checkpoint: metadata.json format_version 3 (eval)", "eval -c tiny.json --checkpoint " + CK, [edit_json(CK + "/metadata.json", "format_version", 3), resign()], [CK + "/metadata.json", "format_version 3"], hint="version that wrote it"),
    Case("checkpoint: metadata.json format_version 3 (info)", "ckpt info " + CK, [edit_json(CK + "/metadata.json", "format_version", 3), resign()], [CK + "/metadata.json", "format_version 3"]),
    Case("checkpoint: metadata.json chunk_bytes other than the format's", "ckpt verify " + CK, [edit_json(CK + "/metadata.json", "chunk_bytes", 7), resign()], [CK + "/metadata.json", "chunk_bytes = 7"]),
    Case("checkpoint: a tensor of another shape than the model's", "ckpt verify " + CK, [edit_json(CK + "/metadata.json", "model.d_model", 64), resign()], ["of another shape or type than the model of this checkpoint's config"]),
    Case("checkpoint: metadata.json's step against its trainer state's", "ckpt verify " + CK, [edit_json(CK + "/metadata.json", "trainer_state.step", 99), resign()], [CK + "/metadata.json", "trainer_state.step 99"]),
    Case("checkpoint: COMMITTED of another format version", "ckpt verify " + CK, [edit_json(CK + "/COMMITTED", "format_version", 1)], [CK + "/COMMITTED", "format_version 1"]),
    Case("checkpoint: metadata.json without pieces", "ckpt verify " + CK, [edit_json(CK + "/metadata.json", "pieces", delete=True), resign()], [CK + "/metadata.json", "pieces"]),
    Case("checkpoint: metadata.json piece outside its file", "ckpt verify " + CK, [edit_json(CK + "/metadata.json", "pieces.0.byte_offset", 1 << 30), resign()], [CK + "/metadata.json"]),
    Case("checkpoint: metadata.json file name with a path", "ckpt verify " + CK, [edit_json(CK + "/metadata.json", "files.0.name", "../rank_00000.bin"), resign()], [CK + "/metadata.json", "../rank_00000.bin"]),
    Case("checkpoint: rank file missing", "eval -c tiny.json --checkpoint " + CK, [remove(CK + "/rank_00000.bin")], [CK + "/rank_00000.bin", "missing"]),
    Case("checkpoint: rank file truncated", "ckpt verify " + CK, [truncate(CK + "/rank_00000.bin", 100)], [CK + "/rank_00000.bin"]),
    Case("checkpoint: rank file flipped (eval)", "eval -c tiny.json --checkpoint " + CK, [flip(CK + "/rank_00000.bin", piece_offset(EMBED))], [CK + "/rank_00000.bin", EMBED]),
    Case("checkpoint: rank file flipped (resume)", "train -c tiny.json --resume --steps 4", [flip(CK + "/rank_00000.bin", piece_offset(EMBED))], ["run/checkpoints could be loaded", CK + "/rank_00000.bin", EMBED]),
    Case("checkpoint: rank file flipped (export)", "ckpt export " + CK + " --hf hf", [flip(CK + "/rank_00000.bin", piece_offset(EMBED))], [CK + "/rank_00000.bin"]),
    Case("checkpoint: the run has no valid checkpoint", "eval -c tiny.json", [remove(CK + "/COMMITTED")], ["run/checkpoints"], hint="--checkpoint"),
    Case("checkpoint: model differs from the config (eval)", "eval -c tiny.json --set model.d_model=64", [], [CK, "model.d_model = 32", "64"]),
    Case("checkpoint: model differs from the config (resume)", "train -c tiny.json --resume --steps 4 --set model.n_layers=3", [], [CK, "model.n_layers = 2", "3"], hint="config"),
    Case("checkpoint: written by the other optimizer", "train -c tiny.json --resume --steps 4 --set train.optimizer=muon", [], [CK, "adamw", "muon"], hint="--set train.optimizer=adamw"),
    Case("checkpoint: data cursor of another seed", "train -c tiny.json --resume --steps 4", [edit_json(CK + "/metadata.json", "trainer_state.data_cursor.seed", 99), resign()], [CK, "seed 99"]),
    Case("checkpoint: synthetic-data run resumed on a dataset", "train -c tiny.json --resume --steps 4", [edit_json(CK + "/metadata.json", "trainer_state.data_cursor", delete=True), resign()], [CK, "synthetic data", "'ds'"], hint="--synthetic-data"),
    Case("checkpoint: export without --hf", "ckpt export " + CK, [], [CK, "no output directory"], hint="--hf"),
    Case("checkpoint: export into a non-empty directory", "ckpt export " + CK + " --hf hf", [write("hf/README", "mine")], ["'hf' is not empty"]),
    Case("checkpoint: export under a file", "ckpt export " + CK + " --hf afile/sub/hf", [write("afile", "mine")], ["'afile' is not a directory"]),

    # -- hardware profiles --
    Case("profile: missing file", "plan --profile nope/profile.json --config tiny.json", [], ["nope/profile.json"]),
    Case("profile: unknown reference name", "plan --profile tpu9 --config tiny.json", [], ["'tpu9'"], hint="mi300x"),
    Case("profile: invalid JSON", "plan --profile profile.json --config tiny.json", [write(BAD_PROFILE, '{"format": ')], ["profile.json"]),
    Case("profile: not a profile", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "format", "something-else")], ["profile.json", "foundry-hardware-profile"]),
    Case("profile: version 2", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "version", 2)], ["profile.json", "version 2"]),
    Case("profile: device kind", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "device.kind", "tpu")], ["profile.json", "device.kind", "tpu"]),
    Case("profile: negative bandwidth", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "memory.measured_bytes_per_s", -1)], ["profile.json", "measured_bytes_per_s"]),
    Case("profile: rate as a string", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "compute.bf16.measured_flops_per_s", "fast")], ["profile.json", "measured_flops_per_s"]),
    Case("profile: GEMM point of size 0", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "gemm.points.0.m", 0)], ["profile.json", "gemm"]),
    Case("profile: no compute rate", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "compute", delete=True)], ["profile.json", "no compute rate"]),
    Case("profile: no collectives for a multi-device plan", "plan --profile profile.json --config tiny.json --devices 2", [], ["profile.json", "collective measurements"], hint="bench comm"),
    Case("profile: unknown collective", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "collectives", [{"op": "all_scatter", "ranks": 2}])], ["profile.json", "all_scatter"]),
    Case("profile: version as a string", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "version", "1")], ["profile.json", "version \"1\""]),
    Case("profile: name a number", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "name", 5)], ["profile.json", "'name' must be a string"]),
    Case("profile: GEMM points not an array", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "gemm.points", "none")], ["profile.json: gemm", "'points' must be an array"]),
    Case("profile: GEMM point's dtype a number", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "gemm.points.0.dtype", 16)], ["profile.json: gemm.points", "'dtype' must be a string"]),
    Case("profile: alignment multiple 0", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "gemm.alignment", [{"multiple": 0, "factor": 5}])], ["profile.json: gemm.alignment", "power-of-two"]),
    Case("profile: collectives an object", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "collectives", {})], ["profile.json", "'collectives' must be an array"]),
    Case("profile: a fit that is not an object", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "collectives", [{"op": "all_reduce", "ranks": 2, "fit": "x"}])], ["profile.json: collectives", "'fit' must be an object"]),
    Case("profile: a fit without its latency", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "collectives", [{"op": "all_reduce", "ranks": 2, "fit": {"beta_bytes_per_s": 1e9}}])], ["all_reduce at 2 ranks).fit", "'alpha_s' is missing"]),
    Case("profile: no memory bandwidth for plan", "plan --profile profile.json --config tiny.json", [edit_json(BAD_PROFILE, "memory", delete=True)], ["profile.json", "no memory bandwidth"], hint="bench membw --profile"),
    Case("profile: bench report of a bad profile", "bench report --profile profile.json --out report", [edit_json(BAD_PROFILE, "version", 7)], ["profile.json", "version 7"]),
    Case("profile: bench all --merge into invalid JSON", "bench all --out bench-out --merge --only membw", [write("bench-out/profile.json", "{")], ["bench-out/profile.json"]),

    # -- run directories: refusing to replace a run, the rules of --resume --
    Case("run dir: a new run over a finished one", "train -c tiny.json", [], ["'run' already holds a run", "checkpoint(s)"], hint="--resume"),
    Case("run dir: --steps 0 over a finished run", "train -c tiny.json --steps 0", [], ["train.steps is 0"], hint="--steps"),
    Case("run dir: a new run over metrics alone", "train -c tiny.json", [remove_tree("run/checkpoints")], ["line(s) of metrics.jsonl"], hint="--overwrite"),
    Case("run dir: --resume without a checkpoint", "train -c tiny.json --resume", [remove_tree("run/checkpoints")], ["has no checkpoint to resume from"], hint="--auto-resume"),
    Case("run dir: --resume with only a checkpoint whose marker was lost", "train -c tiny.json --resume", [remove_committed()], ["no committed checkpoint in 'run/checkpoints'"], hint="--overwrite"),
    Case("run dir: --auto-resume with only a checkpoint whose marker was lost", "train -c tiny.json --auto-resume", [remove_committed()], ["no committed checkpoint"]),
    Case("run dir: --resume and --overwrite together", "train -c tiny.json --resume --overwrite", [], ["--overwrite"], code=USAGE),
    Case("run dir: launch --restart-np 0", "launch -c tiny.json --restart-np 0", [], ["--restart-np"], code=USAGE),
    Case("run dir: launch --launcher unknown", "launch -c tiny.json --launcher pbs", [], ["--launcher"], code=USAGE),
    Case("run dir: in-memory checkpoint directory missing", "train -c tiny.json --overwrite --set train.memory_checkpoint_every=2 train.memory_checkpoint_dir=nowhere", [], ["train.memory_checkpoint_dir = 'nowhere' is not a directory"], hint="memory_checkpoint_every=0"),
    Case("run dir: heartbeat timeout under two beats", "train -c tiny.json --overwrite --set train.heartbeat_timeout_s=1", [], ["train.heartbeat_timeout_s = 1"], hint="twice"),
    Case("run dir: --resume with another lr than the run's", "train -c tiny.json --resume --steps 4 --set train.lr=0.5", [], ["run/config.json", "train.lr: 0.01 -> 0.5"], hint="--allow-config-change"),
    Case("run dir: --resume with another lr, the run's config.json gone", "train -c tiny.json --resume --steps 4 --set train.lr=0.5", [remove("run/config.json")], ["the config recorded in run/checkpoints/step_00000002", "train.lr: 0.01 -> 0.5"], hint="--allow-config-change"),
    Case("run dir: --resume --steps below the checkpoint", "train -c tiny.json --resume --steps 1", [], ["train.steps = 1", "step 2"], hint="above 2"),
    Case("run dir: a new run of 0 steps", "train -c tiny.json --steps 0 --set train.run_dir=fresh", [], ["train.steps is 0"]),
    Case("run dir: --stop-at-step beyond the run", "train -c tiny.json --overwrite --stop-at-step 50", [], ["--stop-at-step 50", "1 to 2"]),
    Case("run dir: --stop-at-step before the resumed step", "train -c tiny.json --resume --steps 6 --stop-at-step 2", [], ["--stop-at-step 2", "3 to 6"]),
    Case("run dir: --overwrite with a file of the user's in checkpoints/", "train -c tiny.json --overwrite", [write("run/checkpoints/mine.txt", "notes")], ["mine.txt", "nothing was removed"], hint="move them"),
    Case("run dir: --overwrite with a step directory no save wrote", "train -c tiny.json --overwrite", [mkdir("run/checkpoints/step_00000009")], ["step_00000009", "without a commit marker"]),
    Case("run dir: --overwrite with a step directory whose COMMITTED is the user's", "train -c tiny.json --overwrite", [mkdir("run/checkpoints/step_00000009"), write("run/checkpoints/step_00000009/COMMITTED", "done")], ["step_00000009", "whose COMMITTED Foundry did not write"]),

    Case("run dir: a file of the user's named config.json", "train -c tiny.json --set train.run_dir=new", [write("new/config.json", '{"my": "settings"}\n')], ["new/config.json", "is not a run config"], hint="move the file"),
    Case("run dir: metrics.jsonl a named pipe", "train -c tiny.json --set train.run_dir=new", [mkfifo("new/metrics.jsonl")], ["new/metrics.jsonl' is a named pipe"], hint="move it out of the run directory"),
    Case("run dir: launch over events.jsonl a named pipe", "launch -c tiny.json --set train.run_dir=new", [mkfifo("new/events.jsonl")], ["new/events.jsonl' is a named pipe"], hint="move it out of the run directory"),
    Case("run dir: checkpoints/latest a directory", "train -c tiny.json --set train.run_dir=new --resume", [mkdir("new/checkpoints/latest")], ["new/checkpoints/latest' is a directory"]),
    Case("run dir: a file of the user's named skipped_batches.json", "train -c tiny.json --set train.run_dir=new", [write("new/skipped_batches.json", "my own notes\n")], ["new/skipped_batches.json", "not a record of skipped batches"], hint="move the file"),
    Case("run dir: train.run_dir empty", "train -c tiny.json --set train.run_dir=", [], ["train.run_dir is empty"]),
    Case("run dir: train.run_dir a file", "train -c tiny.json --set train.run_dir=tiny.json", [], ["train.run_dir 'tiny.json' is a file"]),
    Case("run dir: a refused resume logs no config change", "train -c tiny.json --resume --steps 4 --allow-config-change --set train.seed=7", [], ["data cursor", "seed"]),
    Case("checkpoint: resumed on another dataset of as many windows", "train -c tiny.json --resume --steps 4 --set data.dir=ds2", [dataset_with_other_tokens("ds", "ds2")], ["data cursor", "saved on other tokens", "another dataset"], hint="data.dir"),
    Case("checkpoint: dataset run resumed with --synthetic-data", "train -c tiny.json --resume --steps 4 --synthetic-data", [], [CK, "--synthetic-data would go on with random tokens"], hint="without --synthetic-data"),
    Case("config: train.eps 0", "train -c tiny.json --set train.run_dir=fresh --set train.eps=0", [], ["train.eps = 0"], hint="1e-8"),
    Case("config: model.init_std 0", "model info --config tiny.json --set model.init_std=0", [], ["model.init_std = 0"]),
    Case("config: train.spike_factor 0.5", "train -c tiny.json --set train.run_dir=fresh --set train.spike_factor=0.5", [], ["train.spike_factor = 0.5"], hint="above 1"),
    Case("config: an override replacing a whole section", "train -c tiny.json --set 'model={\"d_model\": 64}'", [], ["model={\"d_model\": 64}", "replace the whole 'model' section"], hint="one by one"),
    Case("config: a number beyond a double in an override", "train -c tiny.json --set train.lr=1e999", [], ["train.lr=1e999", "1e999"]),
    Case("config: a number beyond a double in the file", "train -c tiny.json", [write("tiny.json", '{"model": {"d_model": 32}, "train": {"lr": 1e999}}')], ["tiny.json", "1e999"], hint="1.8e308"),

    # -- a file that parses but belongs to something else --
    Case("other file: a hardware profile as the run config", "train -c profile.json", [], ["profile.json", "unknown key"], hint="model, train"),
    Case("other file: a run config as the hardware profile", "plan --profile tiny.json --config tiny.json", [], ["tiny.json", "not a foundry hardware profile"]),
    Case("other file: a run config as train.hardware_profile", "train -c tiny.json --overwrite --set train.hardware_profile=tiny.json --set train.peak_gflops=0", [], ["tiny.json", "not a foundry hardware profile"]),
    Case("other file: a run directory as data.dir", "train -c tiny.json --overwrite --set data.dir=run", [], ["'run' is not a prepared dataset"]),
    Case("other file: a dataset as --checkpoint", "eval -c tiny.json --checkpoint ds", [], ["'ds' is not a Foundry checkpoint"]),
    Case("other file: a dataset as ckpt export's checkpoint", "ckpt export ds --hf hf", [], ["'ds' is not a Foundry checkpoint"]),

    # -- a count beyond what the data holds --
    Case("count: eval --batches beyond the validation split", "eval -c tiny.json --batches 100000", [], ["--batches 100000", "validation split holds"], hint="or fewer"),
    Case("count: eval --batches past the split's whole batches", "eval -c tiny.json --batches 55", [], ["--batches 55", "109 window(s)", "54 whole batch(es)"], hint="54 or fewer"),
    Case("count: eval with a batch larger than the validation split", "eval -c tiny.json --set train.batch_size=110", [], ["109 window(s)", "not one batch"], hint="train.batch_size"),

    # -- an output file over an input, or over a file this command did not write --
    Case("output: plan --out over its --profile", f"plan --profile {BAD_PROFILE} --total-params 6M --active-params 2M --out {BAD_PROFILE}", [], [f"--out '{BAD_PROFILE}' is the --profile file"]),
    Case("output: plan --out over a file of another kind", f"plan --profile {BAD_PROFILE} --total-params 6M --active-params 2M --out notes.json", [write("notes.json", '{"mine": 1}\n')], ["--out 'notes.json' already holds something"]),
    Case("output: plan --out with --config", f"plan --profile {BAD_PROFILE} --config tiny.json --out p.json", [], ["--out 'p.json'", "with --config"]),
    Case("output: eval --out over its run config", "eval -c tiny.json --choices c.jsonl --out tiny.json", [write("c.jsonl", '{"context": "the", "choices": [" expert", " model"]}\n')], ["--out 'tiny.json' is the --config file"]),
    Case("output: eval --out over a file of another kind", "eval -c tiny.json --choices c.jsonl --out notes.txt", [write("c.jsonl", '{"context": "the", "choices": [" expert", " model"]}\n'), write("notes.txt", "my notes\n")], ["--out 'notes.txt' already holds something"]),
    Case("output: eval --out without --choices", "eval -c tiny.json --out s.jsonl", [], ["--out 's.jsonl'", "--choices"]),
    Case("output: eval --tokenizer without --choices", "eval -c tiny.json --tokenizer ds/tokenizer.model", [], ["--tokenizer 'ds/tokenizer.model'", "--choices"]),
    Case("output: eval --batches with --choices", "eval -c tiny.json --choices c.jsonl --batches 2", [write("c.jsonl", '{"context": "the", "choices": [" expert", " model"]}\n')], ["--batches 2", "--choices"]),
    Case("output: generate --trace over its run config", "generate -c tiny.json --batch req.jsonl --out o.jsonl --trace tiny.json", [write("req.jsonl", '{"prompt": "hi"}\n')], ["--trace 'tiny.json' is the --config file"]),
    Case("output: generate --trace over a file of another kind", "generate -c tiny.json --batch req.jsonl --out o.jsonl --trace notes.tsv", [write("req.jsonl", '{"prompt": "hi"}\n'), write("notes.tsv", "a\tb\n")], ["--trace 'notes.tsv' already holds something"]),
    Case("output: generate --out with --prompt", "generate -c tiny.json -p hi --out g.jsonl", [], ["--out 'g.jsonl' is for --batch"]),
    Case("option: generate --schedule with --prompt", "generate -c tiny.json -p hi --schedule lru", [], ["--schedule requires --batch"], code=USAGE),
    Case("option: generate --max-requests with --prompt", "generate -c tiny.json -p hi --max-requests 4", [], ["--max-requests requires --batch"], code=USAGE),
    Case("option: generate --no-prefix-sharing with --prompt", "generate -c tiny.json -p hi --no-prefix-sharing", [], ["--no-prefix-sharing requires --batch"], code=USAGE),
    Case("output: generate --out in a missing directory", "generate -c tiny.json --batch req.jsonl --out nodir/o.jsonl", [write("req.jsonl", '{"prompt": "hi"}\n')], ["--out 'nodir/o.jsonl'", "'nodir' does not exist"]),
    Case("output: bench gemm --json over a run config", "bench gemm --quick --json tiny.json", [], ["--json 'tiny.json' already holds something"]),
    Case("output: bench gemm --json over a hardware profile", f"bench gemm --quick --json {BAD_PROFILE}", [], [f"--json '{BAD_PROFILE}' already holds something"]),
    Case("output: bench attention --json over a run config", f"bench attention --device cuda --profile {BAD_PROFILE} --json tiny.json", [], ["--json 'tiny.json' already holds something"]),
    Case("output: bench comm --json over a run config", "bench comm --json tiny.json", [], ["--json 'tiny.json' already holds something"]),
    Case("output: bench gemm --json in a missing directory", "bench gemm --quick --json nodir/g.json", [], ["--json 'nodir/g.json'", "'nodir' does not exist"]),
    Case("output: bench decode --out over its --config", "bench decode --config tiny.json --out tiny.json", [], ["--out 'tiny.json' is the --config file"]),

    Case("option: plan --config --seq beyond max_seq_len", f"plan --profile {BAD_PROFILE} --config tiny.json --seq 4096", [], ["--seq 4096", "model.max_seq_len = 32"]),

    Case("option: plan --config with a search budget", f"plan --profile {BAD_PROFILE} --config tiny.json --total-params 6M", [], ["--total-params is an option of the search"]),
    Case("option: plan search with a layout", f"plan --profile {BAD_PROFILE} --total-params 6M --active-params 2M --tp 4", [], ["--tp is for --config"]),

    # -- a directory where a file belongs --
    Case("directory: the run config", "model info --config ds", [], ["'ds': it is a directory"]),
    Case("directory: the hardware profile", "plan --profile ds --total-params 6M --active-params 2M", [], ["profile 'ds' is a directory"]),
    Case("directory: generate --batch", "generate -c tiny.json --batch ds --out o.jsonl", [], ["requests file 'ds': it is a directory"]),
    Case("directory: eval --choices", "eval -c tiny.json --choices ds", [], ["choices file 'ds': it is a directory"]),

    # -- a number that is not a number --
    Case("option: generate --temperature nan", "generate -c tiny.json -p hi --temperature nan", [], ["--temperature", "nan"], code=USAGE),
    Case("option: generate --top-p nan", "generate -c tiny.json -p hi --top-p nan", [], ["--top-p", "nan"], code=USAGE),
    Case("option: plan --tolerance nan", f"plan --profile {BAD_PROFILE} --total-params 6M --active-params 2M --tolerance nan", [], ["--tolerance nan"]),
    Case("option: plan --scatter inf", f"plan --profile {BAD_PROFILE} --total-params 6M --active-params 2M --scatter inf", [], ["--scatter inf"]),
    Case("option: plan --total-params inf", f"plan --profile {BAD_PROFILE} --total-params inf --active-params 2M", [], ["--total-params", "inf"]),
    Case("option: plan --vocab negative", f"plan --profile {BAD_PROFILE} --total-params 6M --active-params 2M --vocab -5", [], ["--vocab", "-5"], code=USAGE),
    Case("option: launch --restart-np the layout does not fit", "launch -c tiny.json --np 2 --restart-np 1 --set train.expert_parallel=2", [], ["train.expert_parallel = 2", "--restart-np 1"], hint="pass --restart-np N with N a multiple of 2"),
    Case("option: launch --restart-np context parallel does not fit", "launch -c tiny.json --np 2 --restart-np 1 --set train.context_parallel=2", [], ["train.context_parallel = 2", "--restart-np 1"], hint="pass --restart-np N with N a multiple of 2"),
    Case("option: launch with heartbeats off", "launch -c tiny.json --set train.heartbeat_interval_s=0", [], ["train.heartbeat_interval_s = 0"], hint="above 0"),
    Case("config: expert_parallel not dividing the experts", "launch -c tiny.json --np 2 --set train.expert_parallel=2 --set model.n_experts=3 --set model.top_k=1", [], ["model.n_experts = 3", "train.expert_parallel = 2"]),
    Case("option: launch --steps negative", "launch -c tiny.json --steps -3", [], ["--steps", "-3"], code=USAGE),
]


# ---- fixtures -----------------------------------------------------------------------------------

WORDS = ("the expert router sends each token to a small set of experts and the model learns which "
         "one fits best when data flows through layers while training runs on many cores with "
         "careful checkpoints shards and tokenizers").split()
OTHER_WORDS = ("quick brown foxes jump over lazy dogs near quiet rivers under bright stars during "
               "long winter nights beside warm fires").split()


def corpus(words, seed, lines):
    rng = random.Random(seed)
    return "".join(" ".join(rng.choice(words) for _ in range(rng.randint(5, 14))) + ".\n"
                   for _ in range(lines))


TINY_CONFIG = {
    "model": {"vocab_size": 300, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
              "head_dim": 8, "n_experts": 4, "top_k": 2, "ffn_dim": 48, "max_seq_len": 32},
    "train": {"steps": 2, "batch_size": 2, "seq_len": 16, "lr": 1e-2, "warmup_steps": 1,
              "precision": "fp32", "log_every": 1, "eval_every": 0, "eval_batches": 1,
              "checkpoint_every": 2, "keep_checkpoints": 2, "checkpoint_async": False,
              "peak_gflops": 100, "run_dir": "run"},
    "data": {"dir": "ds"},
}

PROFILE = {
    "format": "foundry-hardware-profile", "version": 1, "name": "bad-input test cpu",
    "device": {"kind": "cpu", "memory_bytes": 4000000000},
    "compute": {"bf16": {"measured_flops_per_s": 8e11}, "fp32": {"measured_flops_per_s": 4e11}},
    "memory": {"measured_bytes_per_s": 5e10},
    "gemm": {"points": [
        {"dtype": "bf16", "m": 2048, "n": 2048, "k": 2048, "flops_per_s": 8e11, "kind": "square"},
        {"dtype": "fp32", "m": 256, "n": 256, "k": 256, "flops_per_s": 2e11, "kind": "square"}]},
}


def run_ok(foundry, args, cwd):
    r = subprocess.run([foundry] + args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=TIMEOUT_S)
    if r.returncode != 0:
        sys.exit("fixture: foundry %s failed (%d):\n%s" % (" ".join(args), r.returncode, r.stdout))


def build_fixtures(foundry, root):
    with open(os.path.join(root, "corpus.txt"), "w") as f:
        f.write(corpus(WORDS, 1, 400))
    with open(os.path.join(root, "other.txt"), "w") as f:
        f.write(corpus(OTHER_WORDS, 2, 400))
    prep = ["data", "prepare", "--val-fraction", "0.1", "--quiet"]
    run_ok(foundry, prep + ["--input", "corpus.txt", "--out", "ds", "--vocab-size", "300"], root)
    run_ok(foundry, prep + ["--input", "other.txt", "--out", "ds_other", "--vocab-size", "300"], root)
    run_ok(foundry, prep + ["--input", "corpus.txt", "--out", "ds350", "--vocab-size", "350"], root)
    run_ok(foundry, ["data", "prepare", "--val-fraction", "0", "--quiet", "--input", "corpus.txt",
                     "--out", "ds_noval", "--vocab-size", "300"], root)
    shutil.copyfile(os.path.join(root, "ds350/tokenizer.model"), os.path.join(root, "vocab350.model"))
    shutil.rmtree(os.path.join(root, "ds350"))
    for d in ("ds", "ds_other"):
        assert json.load(open(os.path.join(root, d, "meta.json")))["vocab_size"] == 300, d
    with open(os.path.join(root, "tiny.json"), "w") as f:
        json.dump(TINY_CONFIG, f, indent=2)
    with open(os.path.join(root, BAD_PROFILE), "w") as f:
        json.dump(PROFILE, f, indent=2)
    run_ok(foundry, ["train", "-c", "tiny.json", "-q"], root)
    assert os.path.isfile(os.path.join(root, CK, "metadata.json")), "no checkpoint at " + CK
    # The fixtures themselves must be usable: each command that a case breaks works here.
    run_ok(foundry, ["eval", "-c", "tiny.json"], root)
    run_ok(foundry, ["generate", "-c", "tiny.json", "-p", "the expert", "-n", "4"], root)
    run_ok(foundry, ["ckpt", "verify", CK], root)
    run_ok(foundry, ["plan", "--profile", BAD_PROFILE, "--config", "tiny.json"], root)


# ---- running a case -----------------------------------------------------------------------------

def snapshot(root):
    """Every file's SHA-256 and every directory, relative to root."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        state[rel + "/"] = "dir"
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.isfile(path):  # a named pipe of a case: its existence, not its data
                state[os.path.relpath(path, root)] = "special"
                continue
            with open(path, "rb") as f:
                state[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return state


def section(lines, prefix):
    """The text of the first line starting with `prefix`, up to the next error:/hint: line."""
    out = None
    for line in lines:
        if out is None:
            if line.startswith(prefix):
                out = [line[len(prefix):]]
        elif line.startswith(("error: ", "hint: ")):
            break
        else:
            out.append(line)
    return None if out is None else "\n".join(out)


def check_case(case, foundry, fixtures, work, index):
    root = os.path.join(work, "case%03d" % index)
    shutil.copytree(fixtures, root, symlinks=True)
    for step in case.setup:
        step(root)
    before = snapshot(root)
    t0 = time.monotonic()
    try:
        r = subprocess.run([foundry] + case.argv, cwd=root, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, errors="replace", timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return ["timed out after %d s" % TIMEOUT_S], ""
    seconds = time.monotonic() - t0
    out = r.stderr + r.stdout
    problems = []
    if r.returncode == 0:
        problems.append("exited 0")
    elif r.returncode < 0:
        problems.append("killed by signal %d (a crash)" % -r.returncode)
    elif case.code == FAILED and r.returncode != 1:
        problems.append("exit code %d, expected 1" % r.returncode)
    elif case.code == USAGE and not (r.returncode == 2 or 100 <= r.returncode <= 127):
        problems.append("exit code %d, expected a command-line error (2 or CLI11's 100-127)"
                        % r.returncode)
    lines = r.stderr.splitlines()
    if case.code == FAILED:
        error, hint = section(lines, "error: "), section(lines, "hint: ")
        if error is None:
            problems.append("no 'error: ' line on stderr")
        else:
            problems += ["the error does not name '%s'" % s for s in case.expect if s not in error]
        if not hint or not hint.strip():
            problems.append("no 'hint: ' line on stderr")
        elif case.hint and case.hint not in hint:
            problems.append("the hint does not mention '%s'" % case.hint)
    else:
        problems += ["the message does not name '%s'" % s for s in case.expect if s not in out]
    after = snapshot(root)
    for path in sorted(set(before) | set(after)):
        if path not in after:
            problems.append("%s was removed" % path)
        elif path not in before:
            problems.append("%s was left behind" % path)
        elif before[path] != after[path]:
            problems.append("%s was changed" % path)
    if not problems:
        shutil.rmtree(root)
    detail = "(rc %d, %.2f s)" % (r.returncode, seconds)
    if problems:
        detail += "\n    $ foundry %s\n%s" % (shlex.join(case.argv),
                                             "\n".join("    | " + l for l in out.splitlines()))
    return problems, detail


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    # argv[2], the source directory, is part of the tests' calling convention; the fixtures
    # are generated, so nothing is read from it.
    foundry, only = os.path.realpath(sys.argv[1]), sys.argv[3:]
    cases = [c for c in CASES if not only or any(s in c.name for s in only)]
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)), "duplicate case names"
    work = tempfile.mkdtemp(prefix="foundry-bad-input-")
    failures = 0
    try:
        fixtures = os.path.join(work, "fixtures")
        os.makedirs(fixtures)
        t0 = time.monotonic()
        build_fixtures(foundry, fixtures)
        print("fixtures built in %.1f s" % (time.monotonic() - t0), flush=True)
        # Two cases at a time: most of a case is process start-up and file copying.
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            futures = [pool.submit(check_case, c, foundry, fixtures, work, i)
                       for i, c in enumerate(cases)]
            for case, future in zip(cases, futures):
                problems, detail = future.result()
                if problems:
                    failures += 1
                    print("FAIL: %s: %s %s" % (case.name, "; ".join(problems), detail), flush=True)
                else:
                    print("ok: %s %s" % (case.name, detail), flush=True)
    finally:
        if failures == 0:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("the failing cases' directories are kept in %s" % work)
    print("%d cases: %d passed, %d failed" % (len(cases), len(cases) - failures, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
