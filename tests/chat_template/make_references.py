"""Renders every conversation below with transformers' chat-template renderer and writes references.json.

The C++ Jinja subset (policy/io/chat_template.cpp) must reproduce each rendering byte for byte
(ctest policy.chat_template). Run once, in a venv with transformers (see requirements.txt):

    python -m venv /tmp/hf && /tmp/hf/bin/pip install -r tests/chat_template/requirements.txt
    /tmp/hf/bin/python tests/chat_template/make_references.py

It uses transformers.utils.chat_template_utils.render_jinja_template, the function that
tokenizer.apply_chat_template(..., tokenize=False) calls, with bos_token/eos_token passed the way
apply_chat_template passes the tokenizer's special tokens. The templates are in templates/ (origin: README.md).
"""
import json
import pathlib

from transformers.utils.chat_template_utils import render_jinja_template

HERE = pathlib.Path(__file__).resolve().parent

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
                           "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
ADD_TOOL = {
    "type": "function",
    "function": {"name": "add", "description": "Adds two integers.",
                 "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                "required": ["a", "b"]}},
}

SYS = {"role": "system", "content": "You are a terse assistant. Answer in one line."}
U1 = {"role": "user", "content": "What is 2+3?"}
A1 = {"role": "assistant", "content": "5"}
U2 = {"role": "user", "content": "  And times 4?  \n"}
A2 = {"role": "assistant", "content": "20, naïvely \"twenty\"."}
TOOL_Q = {"role": "user", "content": "Weather in Paris and Zürich?"}
CALL_ONE = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
CALL_TWO = {"role": "assistant", "content": "Let me check both.",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                           {"type": "function", "function": {"name": "get_weather",
                                                             "arguments": {"city": "Zürich", "unit": "c"}}}]}
RESULT_P = {"role": "tool", "content": "{\"temp\": 18, \"sky\": \"clear\"}"}
RESULT_Z = {"role": "tool", "content": "{\"temp\": 11, \"sky\": \"rain\"}"}
FINAL = {"role": "assistant", "content": "Paris 18 C clear; Zürich 11 C rain."}
THINK_A = {"role": "assistant", "content": "<think>\n2+3 is 5.\n</think>\n\n5"}
REASON_A = {"role": "assistant", "content": "20", "reasoning_content": "5 times 4 is 20."}
# a multi-turn chat episode as actors.chat_turns builds it (env answers as user and tool turns)
GUESS = [{"role": "system", "content": "You are terse."},
         {"role": "user", "content": "Guess my number from 1 to 10, or call the calculator."},
         {"role": "assistant", "content": "5"}, {"role": "user", "content": "higher"},
         {"role": "assistant", "content": "<tool_call>{\"name\": \"calculator\"}</tool_call>"},
         {"role": "tool", "content": "{\"result\": 12}"},
         {"role": "assistant", "content": "8"}, {"role": "user", "content": "lower, 2 guesses left"}]

CASES = {
    "HuggingFaceTB-SmolLM2-135M-Instruct.jinja": {
        "specials": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
        "cases": [
            ([U1], None, True, {}),
            ([SYS, U1], None, True, {}),
            ([U1, A1, U2], None, False, {}),
            ([SYS, U1, A1, U2, A2], None, False, {}),
            ([SYS, U1, A1, U2], None, True, {}),
            (GUESS, None, True, {}),
        ],
    },
    "meta-llama-Llama-3.2-3B-Instruct.jinja": {
        "specials": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        "cases": [
            ([U1], None, True, {"date_string": "03 Dec 2026"}),
            ([SYS, U1, A1, U2], None, True, {"date_string": "03 Dec 2026"}),
            ([SYS, U1, A1, U2, A2], None, False, {"date_string": "03 Dec 2026"}),
            ([SYS, TOOL_Q, CALL_ONE, RESULT_P], [WEATHER_TOOL], True, {"date_string": "03 Dec 2026"}),
            ([TOOL_Q, CALL_ONE, {"role": "ipython", "content": {"temp": 18}}, FINAL], [WEATHER_TOOL, ADD_TOOL], False,
             {"date_string": "03 Dec 2026", "tools_in_user_message": False}),
            ([SYS, U1], None, True, {"date_string": "26 Jul 2024", "custom_tools": [ADD_TOOL]}),
            (GUESS, None, True, {"date_string": "03 Dec 2026"}),
        ],
    },
    "Qwen-Qwen2.5-7B-Instruct.jinja": {
        "specials": {"bos_token": None, "eos_token": "<|im_end|>"},
        "cases": [
            ([U1], None, True, {}),
            ([SYS, U1, A1, U2], None, True, {}),
            ([U1, A1, U2, A2], None, False, {}),
            ([TOOL_Q, CALL_TWO, RESULT_P, RESULT_Z, FINAL], [WEATHER_TOOL, ADD_TOOL], False, {}),
            ([SYS, TOOL_Q, CALL_ONE, RESULT_P], [WEATHER_TOOL], True, {}),
        ],
    },
    "Qwen-Qwen3-0.6B.jinja": {
        "specials": {"bos_token": None, "eos_token": "<|im_end|>"},
        "cases": [
            ([U1], None, True, {}),
            ([SYS, U1], None, True, {"enable_thinking": False}),
            ([SYS, U1, THINK_A, U2], None, True, {"enable_thinking": True}),
            ([U1, THINK_A, U2, REASON_A], None, False, {}),
            ([SYS, TOOL_Q, CALL_TWO, RESULT_P, RESULT_Z], [WEATHER_TOOL, ADD_TOOL], True, {}),
            ([TOOL_Q, CALL_ONE, RESULT_P, FINAL], [WEATHER_TOOL], False, {"enable_thinking": False}),
            (GUESS, None, True, {}),
        ],
    },
}


def main():
    out = []
    for name, spec in CASES.items():
        template = (HERE / "templates" / name).read_text()
        for messages, tools, gen, extra in spec["cases"]:
            variables = dict(spec["specials"], **extra)
            rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                                add_generation_prompt=gen, **variables)
            out.append({"template": name, "messages": messages, "tools": tools, "add_generation_prompt": gen,
                        "variables": variables, "expected": rendered[0]})
    (HERE / "references.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(out)} references")


if __name__ == "__main__":
    main()
