// What a generator's rollout.serve endpoint served on behalf of episodes: the HTTP threads record
// each finished choice under its episode id, the generator actor hands an episode's turns to the
// coordinator (ServedTurnsReq) and forgets them. Requests without an episode are never recorded.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/actors/messages.h"

namespace troupe::actors {

class ServedTurnLog {
 public:
  void record(const std::string& episode_id, ServedTurn turn) {
    std::lock_guard lk(mu_);
    turns_[episode_id].push_back(std::move(turn));
  }
  // The episode's turns in the order they finished; the log keeps nothing of it afterwards.
  std::vector<ServedTurn> take(const std::string& episode_id) {
    std::lock_guard lk(mu_);
    auto it = turns_.find(episode_id);
    if (it == turns_.end()) return {};
    std::vector<ServedTurn> out = std::move(it->second);
    turns_.erase(it);
    return out;
  }
  size_t episodes() const {
    std::lock_guard lk(mu_);
    return turns_.size();
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::vector<ServedTurn>> turns_;
};

}  // namespace troupe::actors
