// MessagePack <-> JSON values (msgpack-c, Debian libmsgpack-dev), for env servers that speak
// msgpack (the verifiers environment server). Integer map keys become their decimal text and
// binary values strings of their bytes; other map keys, ext types and non-finite floats have no
// JSON form and are errors naming where they were found.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "troupe/base/result.h"

namespace troupe::envs {

std::string json_to_msgpack(const nlohmann::json& j);
Result<nlohmann::json> msgpack_to_json(const void* data, size_t size);

}  // namespace troupe::envs
