#!/usr/bin/env python3
"""launch.generate_messages: `troupe generate DIR --messages FILE.json` renders the conversation with the
directory's chat template (tokenizer_config.json "chat_template" or chat_template.jinja), tokenizes it
without adding BOS/EOS (special tokens such as <|im_start|> written by the template get their ids) and
keeps the --json fields; bad inputs exit 2 naming the file.
    check_generate_messages.py TROUPE FIXTURE_MODEL_DIR TEMPLATES_DIR
Standard library only."""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hf_fixture"))
from check_cli import fail, last_json, run  # noqa: E402  (the CLI helpers of the hf_fixture checks)


def text_tokens(troupe, d, text):
    rc, out, err = run([troupe, "score", d, "--text", text])
    if rc != 0:
        fail(f"score --text exit {rc}: {err}")
    return last_json(out)["tokens"]


def generate(troupe, d, *args):
    rc, out, err = run([troupe, "generate", d, "--json", "--max-tokens", "4", "--temperature", "0", *args])
    if rc != 0:
        fail(f"generate {args} exit {rc}: {err}")
    j = last_json(out)
    for key in ("prompt_tokens", "tokens", "text"):
        if key not in j:
            fail(f"--json output lacks {key}: {j}")
    return j


def expect_exit2(cmd, needle, what):
    rc, out, err = run(cmd)
    if rc != 2 or needle not in err:
        fail(f"{what}: expected exit 2 with '{needle}' in stderr, got {rc}: {err.strip()}")
    print(f"{what}: exit 2: {err.strip().splitlines()[-1]}")


def main():
    troupe, fixture, templates = sys.argv[1:4]
    tmp = tempfile.mkdtemp(prefix="troupe-chat-")
    try:
        d = os.path.join(tmp, "model")
        shutil.copytree(fixture, d)
        smol = open(os.path.join(templates, "HuggingFaceTB-SmolLM2-135M-Instruct.jinja")).read()
        json.dump({"chat_template": smol}, open(os.path.join(d, "tokenizer_config.json"), "w"))
        msgs = os.path.join(tmp, "messages.json")
        json.dump([{"role": "user", "content": "hi there"}], open(msgs, "w"))

        want = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n")
        g = generate(troupe, d, "--messages", msgs)
        want_ids = text_tokens(troupe, d, want)
        if g["prompt_tokens"] != want_ids:
            fail(f"prompt_tokens {g['prompt_tokens']} != tokens of the rendered conversation {want_ids}")
        im_start = 1  # <|im_start|> in the fixture's tokenizer: the template's special token is one id
        if g["prompt_tokens"][0] != im_start or g["prompt_tokens"].count(im_start) != 3:
            fail(f"<|im_start|> not encoded as its id: {g['prompt_tokens']}")
        same = generate(troupe, d, "--prompt", want)
        if same["prompt_tokens"] != g["prompt_tokens"] or same["tokens"] != g["tokens"]:
            fail("--messages and --prompt of the rendered text differ")
        print(f"tokenizer_config.json template: {len(want_ids)} prompt tokens, continuation {g['tokens']}")

        # chat_template.jinja wins over tokenizer_config.json; template variables from the object form.
        qwen3 = open(os.path.join(templates, "Qwen-Qwen3-0.6B.jinja")).read()
        open(os.path.join(d, "chat_template.jinja"), "w").write(qwen3)
        obj = os.path.join(tmp, "object.json")
        json.dump({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
                   "enable_thinking": False}, open(obj, "w"))
        g = generate(troupe, d, "--messages", obj)
        want = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                "<|im_start|>assistant\n<think>\n\n</think>\n\n")
        if g["prompt_tokens"] != text_tokens(troupe, d, want):
            fail("chat_template.jinja + enable_thinking=false: prompt tokens differ from the expected rendering")
        print("chat_template.jinja template with enable_thinking=false: ok")

        # Errors: exit 2 naming the file.
        bad = os.path.join(tmp, "bad.json")
        open(bad, "w").write("[{\"role\": ")
        expect_exit2([troupe, "generate", d, "--messages", bad], "bad.json", "malformed messages file")
        json.dump({"content": "x"}, open(bad, "w"))
        expect_exit2([troupe, "generate", d, "--messages", bad], "messages", "object without messages")
        json.dump([{"content": "x"}], open(bad, "w"))
        expect_exit2([troupe, "generate", d, "--messages", bad], "role", "message without role")
        expect_exit2([troupe, "generate", d, "--messages", os.path.join(tmp, "none.json")], "none.json", "missing file")
        open(os.path.join(d, "chat_template.jinja"), "w").write("{{ messages[0].content }}\n{% include 'x' %}")
        expect_exit2([troupe, "generate", d, "--messages", msgs], "chat_template.jinja:2:4: unsupported statement",
                     "unsupported template syntax")
        open(os.path.join(d, "chat_template.jinja"), "w").write("{{ raise_exception('no system role') }}")
        expect_exit2([troupe, "generate", d, "--messages", msgs], "no system role", "raise_exception")
        os.remove(os.path.join(d, "chat_template.jinja"))
        os.remove(os.path.join(d, "tokenizer_config.json"))
        expect_exit2([troupe, "generate", d, "--messages", msgs], "chat template", "directory without a template")
        open(os.path.join(d, "tokenizer_config.json"), "w").write("{\"chat_template\": 3}")
        expect_exit2([troupe, "generate", d, "--messages", msgs], "tokenizer_config.json", "chat_template not a string")
        print("ok")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
