// envs.trajectory: the standard record round-trips through JSONL exactly; bad lines name FILE:LINE.
#include "troupe/envs/trajectory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

using namespace troupe::envs;

TEST(Trajectory, JsonlRoundTrip) {
  auto dir = std::filesystem::temp_directory_path() / ("troupe_traj_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::string path = (dir / "trajectories" / "step_0.jsonl").string();
  Trajectory t;
  t.episode_id = "ep-1";
  t.env_name = "calculator";
  t.env_version = "1";
  t.seed = 42;
  t.split = Split::eval;
  t.group = 3;
  t.prompt.text = "Compute 2+2";
  t.prompt.messages.push_back({"user", "Compute 2+2"});
  t.prompt.metadata = {{"answer", "4"}};
  TurnRecord turn;
  turn.observation = "Compute 2+2";
  turn.prompt_tokens = {1, 2, 3};
  turn.completion_tokens = {4, 5};
  turn.logprobs = {-0.5f, -1.25f};
  turn.experts = {0, 3, 1, 2};  // MoE: 2 tokens x (1 layer x top-2)
  turn.policy_version = 7;
  turn.completion = "<tool_call>{}</tool_call> \xff bad utf8";
  turn.tool_calls.push_back({"calculator", {{"expression", "2+2"}}, "4", true});
  turn.generate_s = 0.01;
  t.turns.push_back(turn);
  t.reward = 1.0;
  t.reward_components = {{"correct", 1.0}};
  t.termination = Termination::worker_crash;
  t.error = "env worker killed by signal 11";
  {
    auto w = TrajectoryWriter::open(path);
    ASSERT_TRUE(w.ok()) << w.error().message;
    ASSERT_TRUE((*w)->write(t).ok());
    t.episode_id = "ep-2";
    ASSERT_TRUE((*w)->write(t).ok());
  }
  auto back = read_trajectories(path);
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_EQ(back->size(), 2u);
  const Trajectory& r = (*back)[0];
  EXPECT_EQ(r.episode_id, "ep-1");
  EXPECT_EQ((*back)[1].episode_id, "ep-2");
  EXPECT_EQ(r.env_name, "calculator");
  EXPECT_EQ(r.seed, 42u);
  EXPECT_EQ(r.split, Split::eval);
  EXPECT_EQ(r.group, 3);
  EXPECT_EQ(r.prompt.metadata["answer"], "4");
  ASSERT_EQ(r.turns.size(), 1u);
  EXPECT_EQ(r.turns[0].completion_tokens, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(r.turns[0].logprobs, (std::vector<float>{-0.5f, -1.25f}));
  EXPECT_EQ(r.turns[0].experts, (std::vector<int32_t>{0, 3, 1, 2}));
  EXPECT_EQ(r.turns[0].policy_version, 7);
  EXPECT_EQ(r.turns[0].tool_calls[0].arguments["expression"], "2+2");
  EXPECT_EQ(r.termination, Termination::worker_crash);
  EXPECT_EQ(r.error, "env worker killed by signal 11");
  EXPECT_EQ(r.reward_components.at("correct"), 1.0);

  std::ofstream(path, std::ios::app) << "{\"schema\": \"other/9\"}\n";
  auto bad = read_trajectories(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find(path + ":3"), std::string::npos) << bad.error().message;
  std::filesystem::remove_all(dir);
}

// A dense policy's turn records no expert ids: the field is absent, not an empty list.
TEST(Trajectory, ExpertsOnlyWhenRecorded) {
  Trajectory t;
  t.turns.emplace_back();
  EXPECT_FALSE(to_json(t)["turns"][0].contains("experts"));
  t.turns[0].experts = {1, 2};
  EXPECT_EQ(to_json(t)["turns"][0]["experts"], json::array({1, 2}));
}
