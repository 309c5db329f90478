// Drives TcpStoreClient for tcpstore_vs_torch.py, which runs PyTorch's own
// TCPStore server and checks from Python what this program did:
//   tcpstore_probe ops HOST PORT PREFIX     the scenario below, one line per step
//   tcpstore_probe connect HOST PORT        connect only; prints "ok" or the error
// Errors are printed as "error STATUS: message" and exit 1.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "distributed/store/store_server.h"
#include "distributed/store/tcpstore_client.h"
#include "util/error.h"

using namespace pstar::distributed;
using namespace std::chrono_literals;

namespace {

StoreClientOptions options(const char* host, const char* port, std::string prefix) {
  StoreClientOptions o;
  o.host = host;
  o.port = static_cast<std::uint16_t>(std::atoi(port));
  o.protocol = StoreProtocol::kTcpStore;
  o.key_prefix = std::move(prefix);
  o.connect_timeout = 20s;
  o.timeout = 20s;
  return o;
}

const char* status_name(pstar_status s) {
  switch (s) {
    case PSTAR_ERR_COMM: return "PSTAR_ERR_COMM";
    case PSTAR_ERR_INVALID_ARGUMENT: return "PSTAR_ERR_INVALID_ARGUMENT";
    default: return "another status";
  }
}

std::string text(const Store::Bytes& b) { return std::string(b.begin(), b.end()); }

// The steps tcpstore_vs_torch.py expects, in order.  Python set
// "py/greeting" before starting this program, and after "waiting" it sets
// PREFIX + "late".
int ops(const char* host, const char* port, const std::string& prefix) {
  TcpStoreClient raw(options(host, port, ""));
  std::printf("get py/greeting %s\n", text(raw.get("py/greeting", 10s)).c_str());
  TcpStoreClient c(options(host, port, prefix));
  c.set("k", std::string("from-libpstar").data(), 13);
  std::printf("set k\n");
  std::printf("add ctr 5 -> %lld\n", static_cast<long long>(c.add("ctr", 5)));
  std::printf("add ctr -2 -> %lld\n", static_cast<long long>(c.add("ctr", -2)));
  const bool k_there = c.check({"k"});
  const bool both_there = c.check({"k", "missing"});
  std::printf("check k %d missing %d\n", k_there ? 1 : 0, both_there ? 1 : 0);
  try {
    c.wait({"missing"}, 300ms);
    std::printf("wait missing returned\n");
  } catch (const pstar::Error& e) {
    std::printf("wait missing: %s\n", status_name(e.status()));
  }
  // After a timeout the connection was closed; the next call reconnects.
  c.set("empty", "", 0);
  std::printf("get empty size %zu\n", c.get("empty", 10s).size());
  std::printf("waiting\n");
  std::fflush(stdout);
  c.wait({"late"}, 20s);
  std::printf("got late %s\n", text(c.get("late", 10s)).c_str());
  const bool first = c.erase("k");
  const bool second = c.erase("k");
  std::printf("erase k %d then %d\n", first ? 1 : 0, second ? 1 : 0);
  std::printf("done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "ops" && argc == 5) return ops(argv[2], argv[3], argv[4]);
    if (mode == "connect" && argc == 4) {
      StoreClientOptions o = options(argv[2], argv[3], "");
      o.connect_timeout = 3s;
      TcpStoreClient c(o);
      std::printf("ok\n");
      return 0;
    }
    if (mode == "connect-libpstar-server" && argc == 2) {
      // A TCPStore client meeting libpstar's own store server.
      StoreServerOptions so;
      so.host = "127.0.0.1";
      so.port = 0;
      StoreServer server(so);
      StoreClientOptions o = options("127.0.0.1", std::to_string(server.port()).c_str(), "");
      o.connect_timeout = 3s;
      TcpStoreClient c(o);
      std::printf("ok\n");
      return 0;
    }
  } catch (const pstar::Error& e) {
    std::printf("error %s: %s\n", status_name(e.status()), e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: tcpstore_probe ops HOST PORT PREFIX | connect HOST PORT | connect-libpstar-server\n");
  return 2;
}
