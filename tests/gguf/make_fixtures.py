"""Writes the small GGUF fixtures of policy.gguf and policy.gguf_import (committed beside this script).

Run once, in a venv with the `gguf` package (numpy only): `python -m venv /tmp/v && /tmp/v/bin/pip install -r
tests/gguf/requirements.txt && /tmp/v/bin/python tests/gguf/make_fixtures.py`. The files are deterministic.

  types.gguf        metadata of every value type (arrays of strings, ints, floats too), alignment 64, and a
                    tensor of each type troupe reads (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q4_K Q5_K Q6_K), each with
                    `<name>.expected` (F32): the package's own dequantization (gguf.quants.dequantize).
                    Q8_0/Q4_0/Q4_1/BF16 are quantized by the package; K-quants are random valid blocks.
  unsupported.gguf  one Q5_0 tensor (a type troupe does not read).
  tiny_llama.gguf   a 2-layer llama (d 32, 4 heads, 2 kv heads) with a byte-level BPE vocabulary, q/k rows
                    permuted as llama.cpp's convert_hf_to_gguf.py does, no output.weight (tied).
  tiny_llama_hf.gguf  the q/k projections of tiny_llama before the permutation (HF names, F32).
  tiny_llama_badvocab.gguf  tiny_llama with one token fewer than token_embd has rows.
  tiny_llama_spm.gguf  tiny_llama with a `llama` (SentencePiece) vocabulary: <unk> <s> </s>, 256 <0xXX> byte
                    tokens, pieces with scores (its expected token ids: make_smollm2_reference.py, tiny_spm_tokens.json).
  tiny_qwen2.gguf   a 2-layer qwen2 (d 32, 4 heads, 2 kv heads, q/k/v biases), tied, byte-level BPE (pre qwen2);
                    stored as in the checkpoint (llama.cpp permutes only llama's q/k).
  tiny_qwen3.gguf   a 2-layer qwen3 (d 32, 4 heads of 16 = key_length != d / heads, 2 kv heads, q/k RMSNorm), with
                    an output.weight (untied).
"""
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q, GGUFValueType as T

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(1234)


def f16_bytes(x):
    return np.asarray(x, dtype=np.float16).view(np.uint8)


def random_kquant(qtype, rows, cols):
    """Random bytes per super-block with sane fp16 scales (d, dmin / d) so every value is finite."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    nb = rows * cols // block_size
    blocks = rng.integers(0, 256, size=(nb, type_size), dtype=np.uint8)
    if qtype in (Q.Q4_K, Q.Q5_K):
        blocks[:, 0:2] = f16_bytes(rng.uniform(0.001, 0.01, nb)).reshape(nb, 2)
        blocks[:, 2:4] = f16_bytes(rng.uniform(0.001, 0.01, nb)).reshape(nb, 2)
    elif qtype == Q.Q6_K:
        blocks[:, 208:210] = f16_bytes(rng.uniform(0.001, 0.01, nb)).reshape(nb, 2)
    return blocks.reshape(rows, cols // block_size * type_size)


def write_types():
    w = gguf.GGUFWriter(os.path.join(HERE, "types.gguf"), "test")
    w.add_custom_alignment(64)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_uint64("t.u64", 10000000000000)
    w.add_int64("t.i64", -10000000000000)
    w.add_float32("t.f32", 0.15625)
    w.add_float64("t.f64", -1.0e100)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "h\u00e9llo \u4e16\u754c")
    w.add_array("t.strs", ["a", "", "\u00fc\u00df"])
    w.add_key_value("t.ints", [1, -2, 3], T.ARRAY, sub_type=T.INT32)
    w.add_key_value("t.floats", [0.5, -1.25], T.ARRAY, sub_type=T.FLOAT32)
    w.add_key_value("t.u8s", [7, 8, 9], T.ARRAY, sub_type=T.UINT8)
    w.add_key_value("t.bools", [True, False], T.ARRAY, sub_type=T.BOOL)
    rows, cols = 2, 256
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    tensors = {
        "f32": (x, None),
        "f16": (x.astype(np.float16), None),
        "bf16": (gguf.quants.quantize(x, Q.BF16), Q.BF16),
        "q8_0": (gguf.quants.quantize(x, Q.Q8_0), Q.Q8_0),
        "q4_0": (gguf.quants.quantize(x, Q.Q4_0), Q.Q4_0),
        "q4_1": (gguf.quants.quantize(x, Q.Q4_1), Q.Q4_1),
        "q4_k": (random_kquant(Q.Q4_K, rows, cols), Q.Q4_K),
        "q5_k": (random_kquant(Q.Q5_K, rows, cols), Q.Q5_K),
        "q6_k": (random_kquant(Q.Q6_K, rows, cols), Q.Q6_K),
    }
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=qtype)
        expected = data.astype(np.float32) if qtype is None else gguf.quants.dequantize(data, qtype)
        assert expected.shape == (rows, cols), (name, expected.shape)
        w.add_tensor(name + ".expected", np.ascontiguousarray(expected, dtype=np.float32))
    w.add_tensor("vec3d", rng.standard_normal((2, 3, 4)).astype(np.float32))
    finish(w)


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_unsupported():
    w = gguf.GGUFWriter(os.path.join(HERE, "unsupported.gguf"), "test")
    w.add_tensor("odd", gguf.quants.quantize(rng.standard_normal((1, 32)).astype(np.float32), Q.Q5_0), raw_dtype=Q.Q5_0)
    finish(w)


def permute(weights, n_head, n_head_kv):
    """convert_hf_to_gguf.py's LlamaModel.permute: HF rotary halves -> llama.cpp interleaved pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def byte_vocab():
    """256 byte tokens (GPT-2 spelling), 3 specials, a few merges."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    spelled = dict(zip(bs, [chr(c) for c in cs]))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + [spelled[b] for b in range(256)]
    merges = ["h e", "l l", "he ll", "\u0120 w", "o r"]
    for m in merges:
        tokens.append(m.replace(" ", ""))
    types = [3, 3, 3] + [1] * (len(tokens) - 3)
    return tokens, types, merges


def spm_vocab():
    """A SentencePiece-style vocabulary: specials, byte tokens, then pieces by decreasing score."""
    pieces = ["\u2581", "e", "l", "h", "o", "w", "r", "d", "t", "a", "n", "i", "s", "1", "2", "\u2581t", "he", "ll", "\u2581h",
              "\u2581w", "or", "ld", "\u2581the", "hell", "\u2581hell", "\u2581hello", "\u2581wor", "\u2581world", "\u2581a",
              "an", "\u2581an", "in", "is", "\u2581is", "\u2581i", "12", "\u2581\u2581", "\u00e9"]
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(pieces))]
    return tokens, types, scores


def write_tiny_llama(path, drop_token=False, hf_path=None, spm=False):
    C, L, H, KV, I = 32, 2, 4, 2, 64
    D = C // H
    if spm:
        tokens, types, scores = spm_vocab()
    else:
        tokens, types, merges = byte_vocab()
    V = len(tokens)
    r = np.random.default_rng(99)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny llama")
    w.add_uint32("llama.block_count", L)
    w.add_uint32("llama.context_length", 256)
    w.add_uint32("llama.embedding_length", C)
    w.add_uint32("llama.feed_forward_length", I)
    w.add_uint32("llama.attention.head_count", H)
    w.add_uint32("llama.attention.head_count_kv", KV)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32("llama.vocab_size", V)
    w.add_uint32("llama.rope.dimension_count", D)
    w.add_string("tokenizer.ggml.model", "llama" if spm else "gpt2")
    w.add_array("tokenizer.ggml.tokens", tokens[:-1] if drop_token else tokens)
    w.add_key_value("tokenizer.ggml.token_type", types[:-1] if drop_token else types, T.ARRAY, sub_type=T.INT32)
    if spm:
        w.add_key_value("tokenizer.ggml.scores", scores, T.ARRAY, sub_type=T.FLOAT32)
        w.add_uint32("tokenizer.ggml.unknown_token_id", 0)
        w.add_bool("tokenizer.ggml.add_bos_token", True)
    else:
        w.add_string("tokenizer.ggml.pre", "smollm")
        w.add_array("tokenizer.ggml.merges", merges)
        w.add_uint32("tokenizer.ggml.padding_token_id", 0)
        w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_string("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")
    hf = {}

    def mat(rows, cols):
        return (r.standard_normal((rows, cols)) * 0.1).astype(np.float32)

    w.add_tensor("token_embd.weight", gguf.quants.quantize(mat(V, C), Q.Q8_0), raw_dtype=Q.Q8_0)
    w.add_tensor("output_norm.weight", (1 + 0.1 * r.standard_normal(C)).astype(np.float32))
    for l in range(L):
        q, k = mat(H * D, C), mat(KV * D, C)
        hf[f"model.layers.{l}.self_attn.q_proj.weight"] = q
        hf[f"model.layers.{l}.self_attn.k_proj.weight"] = k
        w.add_tensor(f"blk.{l}.attn_q.weight", permute(q, H, H))
        w.add_tensor(f"blk.{l}.attn_k.weight", permute(k, H, KV))
        w.add_tensor(f"blk.{l}.attn_v.weight", mat(KV * D, C).astype(np.float16))
        w.add_tensor(f"blk.{l}.attn_output.weight", gguf.quants.quantize(mat(C, H * D), Q.Q4_1), raw_dtype=Q.Q4_1)
        w.add_tensor(f"blk.{l}.ffn_gate.weight", gguf.quants.quantize(mat(I, C), Q.Q8_0), raw_dtype=Q.Q8_0)
        w.add_tensor(f"blk.{l}.ffn_up.weight", gguf.quants.quantize(mat(I, C), Q.Q4_0), raw_dtype=Q.Q4_0)
        w.add_tensor(f"blk.{l}.ffn_down.weight", gguf.quants.quantize(mat(C, I), Q.Q8_0), raw_dtype=Q.Q8_0)
        w.add_tensor(f"blk.{l}.attn_norm.weight", (1 + 0.1 * r.standard_normal(C)).astype(np.float32))
        w.add_tensor(f"blk.{l}.ffn_norm.weight", (1 + 0.1 * r.standard_normal(C)).astype(np.float32))
    finish(w)
    if hf_path:
        w = gguf.GGUFWriter(hf_path, "test")
        for name, t in hf.items():
            w.add_tensor(name, t)
        finish(w)


def write_tiny_qwen(path, arch):
    C, L, H, KV, I = 32, 2, 4, 2, 64
    D = 8 if arch == "qwen2" else 16
    tokens, types, merges = byte_vocab()
    V = len(tokens)
    r = np.random.default_rng(7 if arch == "qwen2" else 8)
    w = gguf.GGUFWriter(path, arch)
    w.add_name("tiny " + arch)
    w.add_uint32(arch + ".block_count", L)
    w.add_uint32(arch + ".context_length", 512)
    w.add_uint32(arch + ".embedding_length", C)
    w.add_uint32(arch + ".feed_forward_length", I)
    w.add_uint32(arch + ".attention.head_count", H)
    w.add_uint32(arch + ".attention.head_count_kv", KV)
    if arch == "qwen3":
        w.add_uint32(arch + ".attention.key_length", D)
        w.add_uint32(arch + ".attention.value_length", D)
    w.add_float32(arch + ".rope.freq_base", 1000000.0)
    w.add_float32(arch + ".attention.layer_norm_rms_epsilon", 1e-6)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_key_value("tokenizer.ggml.token_type", types, T.ARRAY, sub_type=T.INT32)
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_uint32("tokenizer.ggml.padding_token_id", 0)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")

    def mat(rows, cols):
        return (r.standard_normal((rows, cols)) * 0.2).astype(np.float32)

    def vec(n, base=0.0):
        return (base + 0.1 * r.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", gguf.quants.quantize(mat(V, C), Q.Q8_0), raw_dtype=Q.Q8_0)
    w.add_tensor("output_norm.weight", vec(C, 1.0))
    if arch == "qwen3":
        w.add_tensor("output.weight", mat(V, C).astype(np.float16))
    for l in range(L):
        w.add_tensor(f"blk.{l}.attn_q.weight", mat(H * D, C))
        w.add_tensor(f"blk.{l}.attn_k.weight", mat(KV * D, C))
        w.add_tensor(f"blk.{l}.attn_v.weight", mat(KV * D, C).astype(np.float16))
        if arch == "qwen2":
            w.add_tensor(f"blk.{l}.attn_q.bias", vec(H * D))
            w.add_tensor(f"blk.{l}.attn_k.bias", vec(KV * D))
            w.add_tensor(f"blk.{l}.attn_v.bias", vec(KV * D))
        else:
            w.add_tensor(f"blk.{l}.attn_q_norm.weight", vec(D, 1.0))
            w.add_tensor(f"blk.{l}.attn_k_norm.weight", vec(D, 1.0))
        w.add_tensor(f"blk.{l}.attn_output.weight", gguf.quants.quantize(mat(C, H * D), Q.Q8_0), raw_dtype=Q.Q8_0)
        w.add_tensor(f"blk.{l}.ffn_gate.weight", mat(I, C))
        w.add_tensor(f"blk.{l}.ffn_up.weight", gguf.quants.quantize(mat(I, C), Q.Q4_0), raw_dtype=Q.Q4_0)
        w.add_tensor(f"blk.{l}.ffn_down.weight", mat(C, I))
        w.add_tensor(f"blk.{l}.attn_norm.weight", vec(C, 1.0))
        w.add_tensor(f"blk.{l}.ffn_norm.weight", vec(C, 1.0))
    finish(w)


if __name__ == "__main__":
    write_types()
    write_unsupported()
    write_tiny_llama(os.path.join(HERE, "tiny_llama.gguf"), hf_path=os.path.join(HERE, "tiny_llama_hf.gguf"))
    write_tiny_llama(os.path.join(HERE, "tiny_llama_badvocab.gguf"), drop_token=True)
    write_tiny_llama(os.path.join(HERE, "tiny_llama_spm.gguf"), spm=True)
    write_tiny_qwen(os.path.join(HERE, "tiny_qwen2.gguf"), "qwen2")
    write_tiny_qwen(os.path.join(HERE, "tiny_qwen3.gguf"), "qwen3")
    for f in sorted(os.listdir(HERE)):
        if f.endswith(".gguf"):
            print(f, os.path.getsize(os.path.join(HERE, f)))
