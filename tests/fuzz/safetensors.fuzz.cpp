// Fuzz target: safetensors files (policy/io/safetensors.cpp). The input is a whole file: the 8-byte
// header length, the JSON header (dtypes, shapes, offsets, __metadata__) and the data section.
// Every tensor of an accepted file is read as fp32, through SafetensorsFile and WeightSource.
#include <cstddef>
#include <cstdint>

#include "fuzz_input.h"
#include "troupe/policy/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::policy::io;
  const std::string path = troupe::fuzz::write_scratch("model.safetensors", troupe::fuzz::as_text(data, size));
  auto file = SafetensorsFile::open(path);
  if (!file.ok()) return 0;
  for (const auto& e : file->entries()) {
    (void)file->read(e.name);
    (void)file->read(e.name, {2, 3});  // a shape check that mostly fails
  }
  if (auto all = WeightSource::open_file(path); all.ok()) (void)all->read_all();
  return 0;
}
