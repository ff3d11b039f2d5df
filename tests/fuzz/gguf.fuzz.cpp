// Fuzz target: GGUF files (policy/io/gguf.cpp). The input is a whole .gguf file: header, metadata,
// tensor table, data. Every tensor of an accepted file is dequantized and the typed getters are tried.
#include <cstddef>
#include <cstdint>

#include "fuzz_input.h"
#include "troupe/policy/io/gguf.h"
#include "troupe/policy/io/gguf_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using troupe::policy::io::GgufFile;
  const std::string path = troupe::fuzz::write_scratch("input.gguf", troupe::fuzz::as_text(data, size));
  auto file = GgufFile::open(path);
  if (!file.ok()) return 0;
  for (const auto& [key, value] : file->metadata()) {
    (void)file->get_int(key);
    (void)file->get_float(key);
    (void)file->get_string(key);
    (void)file->get_bool(key);
    (void)file->get_strings(key);
    (void)file->get_floats(key);
    (void)file->get_ints(key);
  }
  for (const auto& t : file->tensors()) (void)file->read(t.name);
  (void)troupe::policy::io::import_gguf(*file);  // config, tokenizer and tensors from the metadata
  return 0;
}
