// `troupe keygen PUBLIC SECRET`: writes a ZeroMQ CURVE key pair (Z85 text; the secret file mode
// 0600) for cluster.curve. Append the public key to the authorized-keys file of the run.
#include <cstdio>
#include <memory>

#include "troupe/launch/commands.h"
#include "troupe/runtime/curve.h"

namespace troupe::launch {

Command add_keygen_command(CLI::App& root) {
  struct Opts {
    std::string pub, sec;
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand("keygen", "Write a CURVE key pair for encrypted tcp between ranks (cluster.curve)");
  app->add_option("public", o->pub, "Public key file to write")->required();
  app->add_option("secret", o->sec, "Secret key file to write (mode 0600)")->required();
  return {app, [o]() -> int {
            if (!runtime::curve_available())
              return report_error(make_error(ErrorCode::io, "this libzmq has no CURVE (built without libsodium)"));
            auto kp = runtime::generate_curve_keypair();
            if (!kp.ok()) return report_error(kp.error());
            if (auto st = runtime::write_curve_keypair(*kp, o->pub, o->sec); !st.ok()) return report_error(st.error());
            std::printf("%s\n", kp->public_key.c_str());  // for the authorized-keys file
            return 0;
          }};
}

}  // namespace troupe::launch
