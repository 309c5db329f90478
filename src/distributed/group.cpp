#include "distributed/group.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "util/error.h"
#include "util/log.h"

#if defined(PSTAR_HAVE_LIBUV)
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "distributed/liveness.h"
#include "distributed/store/store.h"
#include "distributed/store/store_server.h"
#endif
#if defined(PSTAR_HAVE_GLOO) && defined(PSTAR_HAVE_LIBUV)
#include "distributed/comm/gloo_communicator.h"
#include "distributed/store/gloo_store.h"
#endif
#if defined(PSTAR_HAVE_NCCL) && defined(PSTAR_HAVE_LIBUV)
#include "distributed/comm/nccl_communicator.h"
#endif

namespace pstar::distributed {

bool cuda_groups_available() {
#if defined(PSTAR_HAVE_NCCL) && defined(PSTAR_HAVE_LIBUV)
  return true;
#else
  return false;
#endif
}

bool cpu_groups_available() {
#if defined(PSTAR_HAVE_GLOO) && defined(PSTAR_HAVE_LIBUV)
  return true;
#else
  return false;
#endif
}

#if defined(PSTAR_HAVE_LIBUV)
namespace {

[[maybe_unused]] bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// The address of the local interface that routes to `host` (a UDP
// connect() chooses it without sending anything); 0.0.0.0-style failures
// fall back to the host name, which Gloo resolves itself.
[[maybe_unused]] std::string local_address_towards(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &res) == 0 && res != nullptr) {
    const int fd = ::socket(res->ai_family, SOCK_DGRAM, 0);
    std::string found;
    if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      sockaddr_in local{};
      socklen_t len = sizeof local;
      char buf[INET_ADDRSTRLEN] = {0};
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
          ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf) != nullptr) {
        found = buf;
      }
    }
    if (fd >= 0) ::close(fd);
    freeaddrinfo(res);
    if (!found.empty() && found != "0.0.0.0") return found;
  }
  char name[256] = {0};
  if (::gethostname(name, sizeof name - 1) == 0 && name[0] != '\0') return name;
  return "127.0.0.1";
}

// Rank 0's store servers, one per port, kept until the process exits (see
// group.h).  Deliberately never destroyed: a static destructor would stop a
// server at exit while other static destructors may still log.
std::mutex& servers_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<uint16_t, StoreServer*>& servers() {
  static auto* m = new std::map<uint16_t, StoreServer*>();
  return *m;
}

[[maybe_unused]] void ensure_server(const LaunchInfo& li) {
  std::lock_guard<std::mutex> lock(servers_mutex());
  if (servers().count(li.master_port) != 0) return;
  StoreServerOptions so;
  // A loopback master serves loopback only; otherwise every interface (the
  // store trusts the network it listens on; docs/distributed.md).
  so.host = is_loopback(li.master_addr) ? li.master_addr : "0.0.0.0";
  so.port = li.master_port;
  auto* server = new StoreServer(so);
  servers()[li.master_port] = server;
  log::debug("rendezvous store served on " + server->endpoint());
}

// Gloo's TCP transport writes to its sockets without MSG_NOSIGNAL: when a
// peer dies, the next write raises SIGPIPE, whose default action kills this
// rank before the collective can fail with PSTAR_ERR_COMM.  The default is
// replaced by "ignore" (writes then fail with EPIPE); a handler or
// disposition the program chose is left alone.
[[maybe_unused]] void ignore_sigpipe_if_default() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current;
    if (::sigaction(SIGPIPE, nullptr, &current) != 0) return;
    if (current.sa_handler != SIG_DFL || (current.sa_flags & SA_SIGINFO) != 0) return;
    struct sigaction ignore;
    std::memset(&ignore, 0, sizeof ignore);
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    if (::sigaction(SIGPIPE, &ignore, nullptr) == 0) {
      log::info(
          "data parallelism: SIGPIPE is now ignored (it was at its default, which would kill this rank "
          "when a peer dies)");
    }
  });
}

// A rank of a world of two or more, and where to meet.
[[maybe_unused]] void require_group_launch(const LaunchInfo& li, const std::string& what) {
  require(li.world_size >= 2 && li.rank >= 0 && li.rank < li.world_size, PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return what + ": needs a rank of a world of two or more"; });
  require(li.master_port != 0 && !li.master_addr.empty(), PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return what + ": no rendezvous address (MASTER_ADDR, MASTER_PORT)"; });
}

[[maybe_unused]] std::atomic<uint64_t>& group_counter() {
  static std::atomic<uint64_t> n{0};
  return n;
}

// Where this rank's store clients connect: rank 0's own server (started
// here when this is rank 0), or torchrun's TCPStore with libpstar's keys
// under their own prefix.
[[maybe_unused]] StoreClientOptions store_options(const LaunchInfo& li, std::chrono::milliseconds timeout) {
  StoreClientOptions co;
  co.host = li.master_addr;
  co.port = li.master_port;
  co.connect_timeout = timeout;
  co.timeout = timeout;
  if (li.torch_agent_store) {
    co.protocol = StoreProtocol::kTcpStore;
    co.key_prefix = li.store_key_prefix;
  } else if (li.rank == 0) {
    ensure_server(li);
  }
  return co;
}

}  // namespace
#endif

#if defined(PSTAR_HAVE_GLOO) && defined(PSTAR_HAVE_LIBUV)
std::unique_ptr<Communicator> form_cpu_group(const GroupOptions& o) {
  const LaunchInfo& li = o.launch;
  require_group_launch(li, "form_cpu_group");
  ignore_sigpipe_if_default();
  const uint64_t group = group_counter().fetch_add(1);
  const StoreClientOptions co = store_options(li, o.timeout);
  std::shared_ptr<Store> client = connect_store(co);
  auto store = std::make_shared<GlooStore>(client, o.timeout);
  GlooConfig gc;
  gc.rank = li.rank;
  gc.size = li.world_size;
  const char* forced = std::getenv("PSTAR_GLOO_ADDR");
  if (forced != nullptr && forced[0] != '\0') {
    gc.hostname = forced;
  } else {
    gc.hostname = is_loopback(li.master_addr) ? "127.0.0.1" : local_address_towards(li.master_addr, li.master_port);
  }
  gc.timeout = o.timeout;
  gc.prefix = "pstar/group/" + std::to_string(group);
  std::unique_ptr<Communicator> comm = make_gloo_communicator(gc, store);
  comm->barrier();
  // Failures name the peer that is gone or stuck (distributed/liveness.h).
  comm = std::make_unique<MonitoredCommunicator>(std::move(comm),
                                                 std::make_unique<Liveness>(co, gc.prefix, li.rank, li.world_size));
  log::info("data-parallel group " + std::to_string(group) + " formed: " + describe(li) + ", gloo on " + gc.hostname);
  return comm;
}

#else

std::unique_ptr<Communicator> form_cpu_group(const GroupOptions&) {
  throw Error(PSTAR_ERR_UNSUPPORTED,
              "data parallelism on the emulated device needs Gloo and libuv, and this build has neither or only one "
              "(install libgloo-dev and libuv1-dev and rebuild)");
}

#endif

#if defined(PSTAR_HAVE_NCCL) && defined(PSTAR_HAVE_LIBUV)
std::unique_ptr<Communicator> form_cuda_group(const GroupOptions& o, int device) {
  const LaunchInfo& li = o.launch;
  require_group_launch(li, "form_cuda_group");
  const uint64_t group = group_counter().fetch_add(1);
  const StoreClientOptions co = store_options(li, o.timeout);
  const std::unique_ptr<Store> store = connect_store(co);
  Store& client = *store;
  const std::string key = "pstar/group/" + std::to_string(group) + "/nccl-id";
  // Rank 0's ncclUniqueId through the store: it sets the key, the others
  // wait for it (within the timeout) and read it.
  NcclIdExchange exchange = [&](std::vector<char>& id) {
    if (li.rank == 0) {
      client.set(key, id.data(), id.size());
    } else {
      client.wait({key}, o.timeout);
      const Store::Bytes got = client.get(key, o.timeout);
      id.assign(got.begin(), got.end());
    }
  };
  NcclConfig nc;
  nc.rank = li.rank;
  nc.size = li.world_size;
  nc.device = device;
  nc.timeout = o.timeout;
  std::unique_ptr<Communicator> comm = make_nccl_communicator(nc, exchange);
  comm->barrier();
  comm = std::make_unique<MonitoredCommunicator>(
      std::move(comm), std::make_unique<Liveness>(co, "pstar/group/" + std::to_string(group), li.rank, li.world_size));
  log::info("data-parallel group " + std::to_string(group) + " formed: " + describe(li) + ", nccl on CUDA device " +
            std::to_string(device));
  return comm;
}
#else
std::unique_ptr<Communicator> form_cuda_group(const GroupOptions&, int) {
  throw Error(PSTAR_ERR_UNSUPPORTED,
              "data parallelism on CUDA devices needs NCCL and libuv, and this build lacks one or both (install "
              "the CUDA toolkit with NCCL and libuv1-dev, then rebuild)");
}
#endif

}  // namespace pstar::distributed
