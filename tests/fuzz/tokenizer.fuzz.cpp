// Fuzz target: tokenizer files (policy/io/tokenizer.cpp): a Hugging Face tokenizer.json or troupe's
// own troupe_tokenizer.json, told apart by content. An accepted tokenizer encodes fixed texts and
// decodes their ids, every id of its vocabulary and some outside it.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_input.h"
#include "troupe/policy/io/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::policy::io;
  const std::string path = troupe::fuzz::write_scratch("tokenizer.json", troupe::fuzz::as_text(data, size));
  auto tok = load_tokenizer_file(path);
  if (!tok.ok()) return 0;
  const Tokenizer& t = **tok;
  for (const char* text : {"", "Hello, world! 12 + 30 = 42.\n", "  leading\tspaces and <|im_start|> specials <eos>",
                           "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x99\x82", "\xff\xfe invalid \xc3"}) {
    auto ids = t.encode(text);
    if (ids.ok()) {
      (void)t.decode(*ids);
      (void)t.decode(*ids, /*skip_special=*/true);
    }
  }
  std::vector<int32_t> every;
  const int n = t.vocab_size();
  for (int32_t id = -2; id < n + 2 && id < 70000; ++id) every.push_back(id);
  (void)t.decode(every);
  (void)t.decode(every, /*skip_special=*/true);
  (void)t.token_id("<eos>");
  return 0;
}
