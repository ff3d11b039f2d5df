#!/usr/bin/env python3
"""launch.serve_openai_client_tools: a tool call end to end through `troupe serve` and the official `openai`
client. The model is a test model fixed to call a tool: the tiny Qwen2 fixture (tests/hf_fixture/qwen2) with
Qwen2.5-Instruct's own chat template (its Hermes `<tools>` block) and three added tokens, `<tool_call>`, one
token spelling `{"name": "get_weather", "arguments": {"city": "Paris"}}`, and `</tool_call>`; its weights are
rewritten so that its layers add nothing to the residual stream and its LM head is a bigram table: after
`<tool_call>` comes the call token, then `</tool_call>`, then `<|im_end|>` (EOS), and after any other token
`<tool_call>`. Greedy or sampled, the engine generates that reply for every prompt; everything else is the
server's real path. Checks: the tools reach the template (prompt == `troupe generate --messages` with them),
the reply comes back as `message.tool_calls` with `finish_reason: "tool_calls"` and `content: null` (also
streamed: the calls in the last chunk, no `<tool_call>` text in the deltas), `tool_choice: "none"` leaves the
text alone, and a follow-up conversation with the assistant's `tool_calls` message (as the client returned it)
and a `role: tool` message renders as Qwen2.5's template renders it (arguments as a JSON object, the result in
`<tool_response>`), equal to `troupe generate --messages` of the same conversation, also in the shape a
verifiers env sends it (content null beside the calls, the tool's content as text parts).
    check_serve_openai_tools.py TROUPE QWEN2_FIXTURE_DIR QWEN25_TEMPLATE
Uses the venv of check_serve_openai.py (the `openai` package, installed on first use)."""
import json
import os
import shutil
import signal
import struct
import sys
import tempfile
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_serve_openai import API_KEY, ensure_openai, fail, start_server, troupe_generate, troupe_of  # noqa: E402

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ADDED = ["<tool_call>", CALL, "</tool_call>"]


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            fail(f"{path}: {name} is {t['dtype']}, expected F32")
        a = array("f")
        a.frombytes(data[t["data_offsets"][0]:t["data_offsets"][1]])
        out[name] = (t["shape"], a)
    return out


def write_safetensors(path, tensors):
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        shape, a = tensors[name]
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def make_tool_model(fixture, template, d):
    """The fixed tool-calling model described in the module docstring, written to d."""
    os.makedirs(d)
    tok = json.load(open(os.path.join(fixture, "tokenizer.json")))
    vocab = len(tok["model"]["vocab"])
    ids = {s: vocab + i for i, s in enumerate(ADDED)}
    for s in ADDED:  # not special: decoded into the reply's text, as Qwen's own <tool_call> token
        tok["added_tokens"].append({"id": ids[s], "content": s, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": False})
    json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"))
    im_end = next(t["id"] for t in tok["added_tokens"] if t["content"] == "<|im_end|>")
    cfg = json.load(open(os.path.join(fixture, "config.json")))
    v, h = vocab + len(ADDED), cfg["hidden_size"]
    cfg.update(vocab_size=v, eos_token_id=im_end, max_position_embeddings=2048, tie_word_embeddings=False)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    shutil.copy(template, os.path.join(d, "chat_template.jinja"))

    tensors = read_safetensors(os.path.join(fixture, "model.safetensors"))
    for name, (shape, a) in tensors.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):  # the layers add nothing
            tensors[name] = (shape, array("f", bytes(4 * len(a))))
        elif name.endswith("norm.weight"):
            tensors[name] = (shape, array("f", [1.0] * len(a)))
    # Embedding: basis vector e1, e2, e3 for the three added tokens, e0 for every other token.
    emb = array("f", bytes(4 * v * h))
    for t in range(v):
        emb[t * h + (t - vocab + 1 if t >= vocab else 0)] = 1.0
    # LM head: row next(t) = 10 * embedding(t), every other row 0 (after the final RMSNorm a logit of 80).
    head = array("f", bytes(4 * v * h))
    successor = [(0, ids["<tool_call>"]), (1, ids[CALL]), (2, ids["</tool_call>"]), (3, im_end)]
    for basis, nxt in successor:
        head[nxt * h + basis] = 10.0
    tensors["model.embed_tokens.weight"] = ([v, h], emb)
    tensors["lm_head.weight"] = ([v, h], head)
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    return tok


def decoder(tok):
    """Token id -> bytes for the byte-level BPE tokenizer (GPT-2's byte-to-unicode table)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_of = {chr(c): b for b, c in zip(bs, cs)}
    table = {i: bytes(byte_of[ch] for ch in s) for s, i in tok["model"]["vocab"].items()}
    for t in tok["added_tokens"]:
        table[t["id"]] = t["content"].encode()
    return lambda ids: b"".join(table[i] for i in ids).decode("utf-8", errors="replace")


def main():
    ensure_openai()
    import openai

    troupe, fixture, template = sys.argv[1:4]
    tmp = tempfile.mkdtemp(prefix="troupe-serve-tools-")
    server = None
    try:
        d = os.path.join(tmp, "tool-model")
        decode = decoder(make_tool_model(fixture, template, d))
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                   "parameters": {"type": "object", "properties": {
                                                       "city": {"type": "string"}}, "required": ["city"]}}}]
        msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
        server, url = start_server(troupe, d)
        client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)

        # Turn 1: the tools reach the template; the reply is a tool call.
        r = client.chat.completions.create(model="tiny", messages=msgs, tools=tools, max_tokens=16, temperature=0)
        ch = r.choices[0]
        f = os.path.join(tmp, "turn1.json")
        json.dump({"messages": msgs, "tools": tools}, open(f, "w"))
        g = troupe_generate(troupe, d, "--messages", f, "--max-tokens", "4", "--temperature", "0")
        prompt = troupe_of(ch)["prompt_token_ids"]
        if prompt != g["prompt_tokens"]:
            fail("turn 1: the served prompt differs from `troupe generate --messages` with the tools")
        text = decode(prompt)
        if "<tools>\n" + json.dumps(tools[0]) + "\n</tools>" not in text or not text.endswith("<|im_start|>assistant\n"):
            fail(f"turn 1: the prompt lacks Qwen2.5's <tools> block with the tool, or the generation prompt: {text!r}")
        if g["text"] != "<tool_call>" + CALL + "</tool_call>":
            fail(f"the fixed model generated {g['text']!r}")
        if ch.finish_reason != "tool_calls" or ch.message.content is not None or not ch.message.tool_calls:
            fail(f"turn 1: expected tool_calls with finish_reason tool_calls and content null, got {ch}")
        call = ch.message.tool_calls[0]
        if (len(ch.message.tool_calls) != 1 or call.type != "function" or call.function.name != "get_weather"
                or json.loads(call.function.arguments) != {"city": "Paris"} or not call.id):
            fail(f"turn 1: tool call {ch.message.tool_calls}")
        print(f"turn 1: {len(prompt)} prompt tokens; tool call {call.id} get_weather({call.function.arguments})")

        # Streamed: no <tool_call> text in the deltas; the calls (with index) and finish_reason in the end.
        content, calls, finish = "", [], None
        for chunk in client.chat.completions.create(model="tiny", messages=msgs, tools=tools, max_tokens=16,
                                                    temperature=0, stream=True):
            for c in chunk.choices:
                content += c.delta.content or ""
                calls += c.delta.tool_calls or []
                finish = c.finish_reason or finish
        if content or finish != "tool_calls" or len(calls) != 1 or calls[0].index != 0 \
                or calls[0].function.name != "get_weather" or json.loads(calls[0].function.arguments) != {"city": "Paris"}:
            fail(f"streamed: content {content!r}, calls {calls}, finish_reason {finish}")
        print("streamed: the tool call in the last chunk, no tool-call text in the deltas")

        # tool_choice none: the template gets no tools and the reply stays text.
        n = client.chat.completions.create(model="tiny", messages=msgs, tools=tools, tool_choice="none",
                                           max_tokens=16, temperature=0)
        if n.choices[0].message.tool_calls or n.choices[0].finish_reason != "stop" \
                or n.choices[0].message.content != g["text"] or "<tools>" in decode(troupe_of(n.choices[0])["prompt_token_ids"]):
            fail(f"tool_choice none: {n.choices[0]}")

        # Turn 2: the assistant's message as the client returned it, and the tool's result.
        history = msgs + [ch.message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
        r2 = client.chat.completions.create(model="tiny", messages=history, tools=tools, max_tokens=16, temperature=0)
        p2 = troupe_of(r2.choices[0])["prompt_token_ids"]
        as_hf = msgs + [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]}, {"role": "tool", "content": "sunny, 21 C"}]
        f2 = os.path.join(tmp, "turn2.json")
        json.dump({"messages": as_hf, "tools": tools}, open(f2, "w"))
        g2 = troupe_generate(troupe, d, "--messages", f2, "--max-tokens", "1")
        if p2 != g2["prompt_tokens"]:
            fail(f"turn 2: the served prompt differs from `troupe generate --messages` (arguments as an object):\n"
                 f"{decode(p2)!r}\n{decode(g2['prompt_tokens'])!r}")
        want = ("<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
                + CALL + "\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response>"
                "<|im_end|>\n<|im_start|>assistant\n")
        if not decode(p2).endswith(want):
            fail(f"turn 2: the prompt does not end with {want!r}: {decode(p2)!r}")
        if r2.choices[0].finish_reason != "tool_calls":
            fail(f"turn 2: {r2.choices[0]}")
        # The same turn as a verifiers env sends it (verifiers.v1.dialects.chat.message_to_wire): content null
        # beside the calls, the tool's content as text parts, its name.
        wire = msgs + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "name": "get_weather",
             "content": [{"type": "text", "text": "sunny, 21 C"}]}]
        r3 = client.chat.completions.create(model="tiny", messages=wire, tools=tools, max_tokens=16, temperature=0)
        if troupe_of(r3.choices[0])["prompt_token_ids"] != p2:
            fail(f"turn 2 in verifiers' wire shape renders differently: {decode(troupe_of(r3.choices[0])['prompt_token_ids'])!r}")
        print("turn 2: the assistant's tool_calls and the tool result rendered as Qwen2.5's template renders them")

        server.send_signal(signal.SIGTERM)
        if server.wait(timeout=30) != 0:
            fail(f"SIGTERM: {server.stderr.read()}")
        server = None
        print("launch.serve_openai_client_tools: ok")
    finally:
        if server is not None:
            server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
