// Built-in verifiable environments and their verifiers, callable on their own (tests, the dataset
// env and SFT data generation use them). Every config key is optional; an unknown key is an error.
//   arithmetic   {digits:1, terms:2, ops:"+", format:"plain"|"answer_tags", format_reward:0, eval_fraction:0.2}
//   countdown    {num_numbers:3, min_number:1, max_number:99, max_target:100, use_all:true, format_reward:0.1, eval_fraction:0.2}
//   dataset      {train:PATH, eval:PATH, template:"{question}", answer_field:"answer",
//                 verifier:"exact"|"numeric"|"regex"|"countdown"|"math"|"python"|"none", extract:"answer_tag"|"last_number"|
//                 "boxed"|"gsm8k"|"regex", pattern:REGEX, extract_reference:true, format_reward:0, base_dir:DIR,
//                 eval_fraction:0.2, python only: reward:"MODULE:FUNCTION", reward_timeout_s:10, reward_workers:2,
//                 python:PATH, judge:{url, model, api_key_env, rubric, parse, pattern, field, range,
//                 timeout_s, max_tokens, temperature}, reward_weights:{component: weight}}
//   guess_number {max_number:100, max_turns:8, eval_fraction:0.2}         (multi-turn, higher/lower hints)
//   calculator   {digits:3, terms:2, ops:"+-*", max_turns:4, require_tool:true, format_reward:0.1, eval_fraction:0.2}
// Observation metadata always carries "answer" and "reference_completion" (the text a perfect
// policy would produce, for SFT); multi-turn envs add "reference_turns" (one text per turn).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "troupe/envs/env.h"

namespace troupe::envs {

Result<std::unique_ptr<Env>> make_arithmetic_env(const json& config);
Result<std::unique_ptr<Env>> make_countdown_env(const json& config);
Result<std::unique_ptr<Env>> make_dataset_env(const json& config);
Result<std::unique_ptr<Env>> make_guess_number_env(const json& config);
Result<std::unique_ptr<Env>> make_calculator_env(const json& config);

// TinyZero's countdown scoring: 1 for a correct equation in the last <answer>...</answer>, using
// the numbers exactly once (use_all) or at most once; format_reward for a present but wrong or
// invalid one; 0 without an answer tag. Components: "correct", "format".
VerifyResult countdown_score(const std::string& completion, const std::vector<int64_t>& numbers, int64_t target,
                             bool use_all, double format_reward);

// Answer extraction shared by the text verifiers: the last <answer>...</answer> if present, else the
// first line of the completion, trimmed.
std::string extract_answer(const std::string& completion);

// Verifiers of the dataset env. exact: strings equal after trimming; numeric: equal as exact
// rationals (1/2 == 0.5 == 0.50); regex: the reference is an ECMAScript regex fully matching.
bool verify_exact(const std::string& answer, const std::string& reference);
bool verify_numeric(const std::string& answer, const std::string& reference);

}  // namespace troupe::envs
