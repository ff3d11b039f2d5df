// A POST whose answer is bounded in size and in total time, for the HTTP peers envs call (the
// nemo_gym client, the dataset env's LLM judge). cpp-httplib's timeouts are per read, so a server
// dribbling its answer could hold a call forever, and it keeps any body it is sent in memory.
// Invariant: at most max_bytes of an answer's body are ever held; no body byte is read past timeout_s.
#pragma once

#include <httplib.h>

#include <cstddef>
#include <string>

#include "troupe/base/clock.h"

namespace troupe::envs::detail {

struct BoundedAnswer {
  bool ok = false;  // a whole answer came (any status)
  int status = 0;
  httplib::Headers headers;
  std::string body;
  httplib::Error error = httplib::Error::Success;  // when !ok
  bool too_large = false;      // the body (or its Content-Length) passed max_bytes: the call was cut there
  bool past_deadline = false;  // the body was still arriving timeout_s after the call started
  double seconds = 0;          // how long the call took
};

// POST `body` (application/json) to `path` with the client's own timeouts (per connect, read,
// write) plus a deadline of timeout_s over the whole answer and a bound of max_bytes on its body.
inline BoundedAnswer bounded_post(httplib::Client& client, const std::string& path, const httplib::Headers& headers,
                                  std::string body, size_t max_bytes, double timeout_s) {
  BoundedAnswer out;
  const auto t0 = MonoClock::now();
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = headers;
  req.set_header("Content-Type", "application/json");
  req.body = std::move(body);
  req.content_receiver = [&](const char* data, size_t n, uint64_t /*offset*/, uint64_t total) {
    if (total > max_bytes || out.body.size() + n > max_bytes) {
      out.too_large = true;
      return false;
    }
    if (seconds_since(t0) > timeout_s) {
      out.past_deadline = true;
      return false;
    }
    out.body.append(data, n);
    return true;
  };
  httplib::Response res;
  out.ok = client.send(req, res, out.error);
  out.seconds = seconds_since(t0);
  if (out.too_large || out.past_deadline) out.ok = false;
  if (!out.ok) {
    out.body.clear();
    return out;
  }
  out.status = res.status;
  out.headers = std::move(res.headers);
  return out;
}

}  // namespace troupe::envs::detail
