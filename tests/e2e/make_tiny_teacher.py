"""A tiny Llama model directory with another model's tokenizer: the teacher of the smollm2_distill
slow test (the student's tokenizer, random weights, seeded). Stdlib only (safetensors written by hand).
Usage: make_tiny_teacher.py SOURCE_MODEL_DIR OUT_DIR   (SOURCE: a model directory with config.json and
tokenizer files, e.g. a GGUF's import under $TROUPE_CACHE/gguf)."""
import array
import json
import os
import random
import shutil
import struct
import sys

src, out = sys.argv[1], sys.argv[2]
base = json.load(open(os.path.join(src, "config.json")))
V, C, L, NH, NKV, HD, I = base["vocab_size"], 32, 1, 2, 1, 16, 64
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": C,
       "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
       "intermediate_size": I, "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
       "rope_theta": 10000.0, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
       "torch_dtype": "float32"}
for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
    if k in base:
        cfg[k] = base[k]
shapes = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C]}
for l in range(L):
    p = f"model.layers.{l}."
    shapes.update({p + "input_layernorm.weight": [C], p + "post_attention_layernorm.weight": [C],
                   p + "self_attn.q_proj.weight": [NH * HD, C], p + "self_attn.k_proj.weight": [NKV * HD, C],
                   p + "self_attn.v_proj.weight": [NKV * HD, C], p + "self_attn.o_proj.weight": [C, NH * HD],
                   p + "mlp.gate_proj.weight": [I, C], p + "mlp.up_proj.weight": [I, C],
                   p + "mlp.down_proj.weight": [C, I]})
rng = random.Random(7)
header, blobs, offset = {}, [], 0
for name in sorted(shapes):
    n = 1
    for d in shapes[name]:
        n *= d
    values = array.array("f", [1.0] * n if name.endswith("norm.weight") else (rng.gauss(0, 0.02) for _ in range(n)))
    data = values.tobytes()
    header[name] = {"dtype": "F32", "shape": shapes[name], "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
os.makedirs(out, exist_ok=True)
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for b in blobs:
        f.write(b)
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
    if os.path.exists(os.path.join(src, name)):
        shutil.copy(os.path.join(src, name), os.path.join(out, name))
print(out)
