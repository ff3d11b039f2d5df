// ZeroMQ CURVE keys for authenticated, encrypted tcp between nodes. Keys live in files as Z85
// text (40 characters, as zmq_curve_keypair prints them); an authorized-keys file lists one
// client public key per line ('#' starts a comment). A peer whose key is not listed is refused.
#pragma once

#include <string>
#include <vector>

#include "troupe/base/result.h"

namespace troupe::runtime {

struct CurveKeypair {
  std::string public_key;  // Z85, 40 chars
  std::string secret_key;  // Z85, 40 chars
};

bool curve_available();  // libzmq built with CURVE (libsodium)
Result<CurveKeypair> generate_curve_keypair();
// Writes public and secret key files (the secret with mode 0600).
Status write_curve_keypair(const CurveKeypair& kp, const std::string& public_file, const std::string& secret_file);
Result<CurveKeypair> load_curve_keypair(const std::string& public_file, const std::string& secret_file);
Result<std::vector<std::string>> load_authorized_keys(const std::string& file);

}  // namespace troupe::runtime
