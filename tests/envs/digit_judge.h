// A tiny judge model for the local-judge tests (envs.judge_model, envs.judge_model_run): a one-layer
// dense llama with the char tokenizer whose greedy reply to any prompt is a parseable score. Its
// attention and MLP write nothing (o_proj, down_proj zero), so each position's final hidden state is
// its token's embedding: a digit's embedding is a unit vector of its own, every other token's one
// shared unit vector, and the head maps a digit's vector to that digit and the shared one to '0'.
// So the model repeats a prompt that ends in digit d as "ddd...", and answers "000..." otherwise:
// with a rubric ending in {response}, the verdict is the response's last character when it is a
// digit, else 0.
#pragma once

#include <string>

#include "troupe/base/result.h"

namespace troupe::test_fixtures {

// Writes the model directory (config.json, model.safetensors, the tokenizer) to `dir`; returns it.
Result<std::string> save_digit_judge(const std::string& dir);

}  // namespace troupe::test_fixtures
