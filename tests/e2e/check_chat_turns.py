"""e2e.chat_multi_turn: the trajectories of a rollout.template chat run on the Qwen3 template (env
tests/e2e/chat_turns_env.py). Turn 1's prompt must be the template's rendering of the env's messages;
each turn's tokens must be the ones sampled (an <|endoftext|> EOS dropped, an <|im_end|> kept) followed
by the tokens of the template's next turn (log-prob 0), and each later turn's prompt the previous
context, exactly.

    check_chat_turns.py TROUPE MODEL_DIR RUN_DIR"""
import json
import subprocess
import sys

TROUPE, MODEL, RUN = sys.argv[1:4]
EOS = 0  # the fixture's <|endoftext|> (eos_token_id)


def tokens(text):
    out = subprocess.run([TROUPE, "score", MODEL, "--text", text], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["tokens"]


FIRST = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSay hi.<|im_end|>\n"
         "<|im_start|>assistant\nhi<|im_end|>\n<|im_start|>user\nSay a word.<|im_end|>\n<|im_start|>assistant\n")
TAILS = ["<|im_end|>\n<|im_start|>user\nonce more<|im_end|>\n<|im_start|>assistant\n",
         "<|im_end|>\n<|im_start|>user\n<tool_response>\n{\"result\": 12}\n</tool_response><|im_end|>\n"
         "<|im_start|>assistant\n"]
first = tokens(FIRST)
tails = [tokens(t) for t in TAILS]
rows = [json.loads(line) for line in open(RUN + "/trajectories/grpo.jsonl")]
checked = 0
for r in rows:
    turns = r["turns"]
    assert turns[0]["prompt_tokens"] == first, ("turn 1's prompt is not the rendered messages", r["episode_id"])
    for k in range(len(turns) - 1):
        # a turn's tokens: the sampled ones (an <|im_end|> that ends them kept), then the template's next turn
        got, lps, tail = turns[k]["completion_tokens"], turns[k]["logprobs"], tails[k]
        assert got[-len(tail):] == tail, ("turn", k + 1, "of", r["episode_id"], got, tail)
        assert all(lp == 0.0 for lp in lps[-(len(tail) - 1):]), ("appended tokens carry log-probs", lps)
        assert len(got) == len(tail) or got[-len(tail) - 1] != EOS, "an EOS left before the next turn"
        assert turns[k + 1]["prompt_tokens"] == turns[k]["prompt_tokens"] + got
        checked += 1
assert checked >= 2, f"only {checked} later turns checked"
print(f"chat turns: {len(rows)} trajectories, {checked} later turns end with the template's turns")
