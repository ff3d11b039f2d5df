// CURVE key files: generation, loading and validation (every error names the file and line).
#include "troupe/runtime/curve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace troupe::runtime {

namespace {
bool valid_z85_key(const std::string& k) {
  if (k.size() != 40) return false;
  std::uint8_t raw[32];
  return zmq_z85_decode(raw, k.c_str()) != nullptr;
}
std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}
// The keys of a key file, one per line ('#' comments and blank lines skipped), each checked as
// Z85; with first_only the reading stops at the first. `file_kind` and `key_kind` name them in
// the errors ("CURVE public key file", "CURVE key").
Result<std::vector<std::string>> read_keys(const std::string& file, const std::string& file_kind, const char* key_kind,
                                           bool first_only) {
  std::ifstream in(file);
  if (!in) return invalid_input(file + ": cannot open " + file_kind);
  std::vector<std::string> keys;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    if (!valid_z85_key(line))
      return invalid_input(file + ":" + std::to_string(n) + ": error: not a 40-character Z85 " + key_kind);
    keys.push_back(line);
    if (first_only) break;
  }
  return keys;
}
Result<std::string> read_key_file(const std::string& file, const char* what) {
  TROUPE_ASSIGN_OR_RETURN(auto keys,
                          read_keys(file, std::string("CURVE ") + what + " key file", "CURVE key", /*first_only=*/true));
  if (keys.empty()) return invalid_input(file + ": no CURVE " + what + " key in the file");
  return keys.front();
}
}  // namespace

bool curve_available() { return zmq_has("curve") != 0; }

Result<CurveKeypair> generate_curve_keypair() {
  if (!curve_available()) return invalid_input("CURVE is not available: libzmq was built without libsodium");
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) return make_error(ErrorCode::internal, std::string("zmq_curve_keypair: ") + zmq_strerror(zmq_errno()));
  return CurveKeypair{pub, sec};
}

Status write_curve_keypair(const CurveKeypair& kp, const std::string& public_file, const std::string& secret_file) {
  {
    std::ofstream out(public_file);
    if (!out) return make_error(ErrorCode::io, public_file + ": cannot write");
    out << kp.public_key << "\n";
    out.flush();
    if (!out) return make_error(ErrorCode::io, public_file + ": write failed");
  }
  // The secret is never readable by others, not even while it is written: created 0600, and an
  // existing file is made 0600 before anything is written to it.
  const int fd = ::open(secret_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return make_error(ErrorCode::io, secret_file + ": cannot write: " + std::strerror(errno));
  const std::string line = kp.secret_key + "\n";
  const bool ok = ::fchmod(fd, 0600) == 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  const int err = errno;
  if (::close(fd) != 0 || !ok)
    return make_error(ErrorCode::io, secret_file + ": write failed: " + std::strerror(ok ? errno : err));
  return {};
}

Result<CurveKeypair> load_curve_keypair(const std::string& public_file, const std::string& secret_file) {
  TROUPE_ASSIGN_OR_RETURN(std::string pub, read_key_file(public_file, "public"));
  TROUPE_ASSIGN_OR_RETURN(std::string sec, read_key_file(secret_file, "secret"));
  char derived[41];
  if (zmq_curve_public(derived, sec.c_str()) != 0 || pub != derived)
    return invalid_input(secret_file + ": secret key does not match the public key in " + public_file);
  return CurveKeypair{pub, sec};
}

Result<std::vector<std::string>> load_authorized_keys(const std::string& file) {
  TROUPE_ASSIGN_OR_RETURN(auto keys,
                          read_keys(file, "the CURVE authorized keys file", "CURVE public key", /*first_only=*/false));
  if (keys.empty()) return invalid_input(file + ": no authorized keys (every peer would be refused)");
  return keys;
}

}  // namespace troupe::runtime
