// Private to the `dataset` env: one process-wide copy of a config's loaded rows, shared by every env
// instance built from the same config (an env worker keeps a pool of instances; without this each
// would read and hold the whole dataset). Rows are immutable once loaded; the copy lives while an
// instance holds it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "builtin/dataset_rows.h"

namespace troupe::envs::detail {

// A dataset env's train and held-out rows, and every row by its FILE:LINE (`where`).
struct DatasetSplits {
  std::vector<DatasetRow> train, eval;
  std::map<std::string, const DatasetRow*> by_where;
};

// The splits loaded for `key` (the env's whole config), from an instance that still holds them, or
// `load()`ed now (under a lock: a second caller with the same key waits and shares the result).
Result<std::shared_ptr<const DatasetSplits>> shared_dataset_splits(const std::string& key,
                                                                   const std::function<Result<DatasetSplits>()>& load);

}  // namespace troupe::envs::detail
