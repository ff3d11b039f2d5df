// The `dataset` env's process-wide row cache (dataset_cache.h): weak references keyed by the env's
// config, so the rows are freed with the last instance that uses them.
#include "builtin/dataset_cache.h"

#include <mutex>

namespace troupe::envs::detail {

Result<std::shared_ptr<const DatasetSplits>> shared_dataset_splits(const std::string& key,
                                                                   const std::function<Result<DatasetSplits>()>& load) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const DatasetSplits>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end())
    if (auto held = it->second.lock()) return held;
  TROUPE_ASSIGN_OR_RETURN(DatasetSplits loaded, load());
  auto splits = std::make_shared<DatasetSplits>(std::move(loaded));
  for (const auto* rows : {&splits->train, &splits->eval})
    for (const DatasetRow& row : *rows) splits->by_where[row.where] = &row;
  std::erase_if(cache, [](const auto& entry) { return entry.second.expired(); });
  cache[key] = splits;
  return std::shared_ptr<const DatasetSplits>(std::move(splits));
}

}  // namespace troupe::envs::detail
