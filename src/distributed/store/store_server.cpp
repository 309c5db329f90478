#include "distributed/store/store_server.h"

#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <uv.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "distributed/store/store_protocol.h"
#include "util/error.h"
#include "util/log.h"

namespace pstar::distributed {
namespace {

using Bytes = std::vector<std::uint8_t>;
using Value = std::shared_ptr<const Bytes>;

// Bytes a read may append at once.
constexpr std::size_t kReadChunkBytes = std::size_t{64} << 10;
// A buffer larger than this is given back once it holds nothing.
constexpr std::size_t kKeepBufferBytes = std::size_t{1} << 20;
// Bytes of later frames buffered behind a parked request before reading
// stops (a client of ours sends nothing while it waits; this bounds a peer
// that pipelines behind a WAIT).
constexpr std::size_t kMaxBufferedWhileParked = std::size_t{64} << 10;
// Response bytes queued unsent before the peer counts as not reading them:
// two maximal values.  Our clients read each response before the next
// request, so they never queue more than one.
constexpr std::size_t kMaxQueuedResponseBytes = 2 * wire::kMaxValueBytes + 4096;
// TCP keepalive idle time, in seconds: lets the kernel notice a vanished
// peer whose request is parked.
constexpr unsigned kKeepaliveSeconds = 60;

std::string address_name(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    uv_ip4_name(a, host, sizeof host);
    port = ntohs(a->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    uv_ip6_name(a, host, sizeof host);
    port = ntohs(a->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return "?";
}

std::string uv_message(int rc) { return std::string(uv_err_name(rc)) + " (" + uv_strerror(rc) + ")"; }

}  // namespace

struct StoreServer::Impl {
  struct Connection {
    Impl* server = nullptr;
    uv_tcp_t tcp;
    uv_timer_t stall_timer;
    int open_handles = 2;  // tcp, stall_timer: freed when both are closed
    std::string peer;
    bool greeted = false;   // handshake done
    bool closing = false;   // uv_close issued
    bool retiring = false;  // version mismatch: hello sent, shutting down
    bool reading = false;   // uv_read_start in effect
    // Received bytes not yet consumed are in[in_begin, in_end).
    Bytes in;
    std::size_t in_begin = 0;
    std::size_t in_end = 0;
    // The parked request, if any.
    bool parked = false;
    wire::Op parked_op = wire::Op::kGet;
    std::vector<std::string> parked_keys;

    std::size_t buffered() const { return in_end - in_begin; }
  };

  // One response in flight: the fixed bytes and a small payload inline, a
  // stored value by reference (a later SET may replace it in the map while
  // libuv still sends the old one).
  struct WriteRequest {
    uv_write_t req;
    std::array<std::uint8_t, 16> head;
    std::size_t head_bytes = 0;
    Value value;
  };

  StoreServerOptions options;
  std::string endpoint;
  std::uint16_t port = 0;

  uv_loop_t loop;
  uv_tcp_t listener;
  uv_async_t stop_async;
  std::thread thread;
  std::mutex stop_mutex;

  std::atomic<std::uint64_t> accepted{0};
  std::atomic<std::uint64_t> dropped{0};
  std::atomic<std::uint64_t> open{0};

  // Loop-thread state.
  std::unordered_map<std::string, Value> data;
  std::unordered_map<std::string, std::unordered_set<Connection*>> waiters;
  std::unordered_set<Connection*> connections;
  // Connections whose parked request was answered while another connection
  // was being served; they resume from the top of the callback, not from
  // inside it, so a chain of wake-ups never recurses.
  std::vector<Connection*> runnable;

  // ---- logging ----
  std::string prefix() const { return "store server " + endpoint + ": "; }

  // ---- connection lifetime ----
  static void on_handle_closed(uv_handle_t* handle) {
    auto* c = static_cast<Connection*>(handle->data);
    if (--c->open_handles == 0) delete c;
  }

  void close_connection(Connection* c) {
    if (c->closing) return;
    c->closing = true;
    unpark(c);
    connections.erase(c);
    open.fetch_sub(1);
    uv_timer_stop(&c->stall_timer);
    uv_close(reinterpret_cast<uv_handle_t*>(&c->stall_timer), on_handle_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), on_handle_closed);
  }

  // A misbehaving peer: logged with the reason, counted, closed.
  void drop(Connection* c, const std::string& reason) {
    if (c->closing) return;
    log::warn(prefix() + "dropping peer " + c->peer + ": " + reason);
    dropped.fetch_add(1);
    close_connection(c);
  }

  // ---- writes ----
  static void on_write(uv_write_t* req, int status) {
    auto* w = reinterpret_cast<WriteRequest*>(req);
    auto* c = static_cast<Connection*>(req->handle->data);
    if (status < 0 && status != UV_ECANCELED && !c->closing) {
      // The peer went away (a client that timed out, say): not misbehaviour.
      log::debug(c->server->prefix() + "write to " + c->peer + " failed: " + uv_message(status));
      c->server->close_connection(c);
    }
    delete w;
  }

  void send(Connection* c, const std::uint8_t* head, std::size_t head_bytes, Value value) {
    if (c->closing) return;
    const std::size_t queued = uv_stream_get_write_queue_size(reinterpret_cast<uv_stream_t*>(&c->tcp));
    if (queued > kMaxQueuedResponseBytes) {
      drop(c, "does not read its responses (" + std::to_string(queued) + " bytes queued)");
      return;
    }
    auto* w = new WriteRequest;
    std::memcpy(w->head.data(), head, head_bytes);
    w->head_bytes = head_bytes;
    w->value = std::move(value);
    uv_buf_t bufs[2];
    unsigned nbufs = 1;
    bufs[0] = uv_buf_init(reinterpret_cast<char*>(w->head.data()), static_cast<unsigned>(head_bytes));
    if (w->value && !w->value->empty()) {
      // uv_buf_t takes a mutable pointer; libuv only reads it.
      bufs[1] = uv_buf_init(const_cast<char*>(reinterpret_cast<const char*>(w->value->data())),
                            static_cast<unsigned>(w->value->size()));
      nbufs = 2;
    }
    const int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&c->tcp), bufs, nbufs, on_write);
    if (rc < 0) {
      delete w;
      log::debug(prefix() + "write to " + c->peer + " failed: " + uv_message(rc));
      close_connection(c);
    }
  }

  void respond(Connection* c, wire::ResponseStatus status, const std::uint8_t* payload = nullptr,
               std::size_t payload_bytes = 0) {
    std::uint8_t head[16] = {};
    wire::store_u32(head, static_cast<std::uint32_t>(wire::kResponseFixedBytes + payload_bytes));
    head[4] = static_cast<std::uint8_t>(status);
    if (payload_bytes > 0) std::memcpy(head + 8, payload, payload_bytes);  // at most 8 bytes
    send(c, head, 8 + payload_bytes, nullptr);
  }

  void respond_value(Connection* c, const Value& value) {
    std::uint8_t head[8] = {};
    wire::store_u32(head, static_cast<std::uint32_t>(wire::kResponseFixedBytes + value->size()));
    head[4] = static_cast<std::uint8_t>(wire::ResponseStatus::kOk);
    send(c, head, 8, value);
  }

  void respond_byte(Connection* c, bool b) {
    const std::uint8_t byte = b ? 1 : 0;
    respond(c, wire::ResponseStatus::kOk, &byte, 1);
  }

  void respond_u64(Connection* c, std::uint64_t v) {
    std::uint8_t bytes[8];
    wire::store_u64(bytes, v);
    respond(c, wire::ResponseStatus::kOk, bytes, 8);
  }

  // ---- parking ----
  void park(Connection* c, wire::Op op, std::vector<std::string> keys) {
    c->parked = true;
    c->parked_op = op;
    c->parked_keys = std::move(keys);
    for (const std::string& k : c->parked_keys) {
      if (data.count(k) == 0) waiters[k].insert(c);
    }
  }

  void unpark(Connection* c) {
    if (!c->parked) return;
    for (const std::string& k : c->parked_keys) {
      auto it = waiters.find(k);
      if (it == waiters.end()) continue;
      it->second.erase(c);
      if (it->second.empty()) waiters.erase(it);
    }
    c->parked = false;
    c->parked_keys.clear();
  }

  // Answers c's parked request if all its keys exist now; otherwise makes
  // sure it is registered under each missing key (one may have been deleted
  // since it was parked).
  void try_complete(Connection* c) {
    bool all_exist = true;
    for (const std::string& k : c->parked_keys) {
      if (data.count(k) == 0) {
        all_exist = false;
        waiters[k].insert(c);
      }
    }
    if (!all_exist) return;
    const wire::Op op = c->parked_op;
    const std::string first_key = c->parked_keys.front();
    unpark(c);
    if (op == wire::Op::kGet) {
      respond_value(c, data.at(first_key));
    } else {
      respond(c, wire::ResponseStatus::kOk);
    }
    runnable.push_back(c);
  }

  void key_created(const std::string& key) {
    auto it = waiters.find(key);
    if (it == waiters.end()) return;
    std::vector<Connection*> woken(it->second.begin(), it->second.end());
    waiters.erase(it);
    for (Connection* c : woken) {
      if (!c->closing && c->parked) try_complete(c);
    }
  }

  // ---- requests ----
  void handle(Connection* c, const wire::Request& r) {
    using wire::Op;
    using wire::ResponseStatus;
    switch (r.op) {
      case Op::kSet: {
        const bool created = data.count(r.keys[0]) == 0;
        data[r.keys[0]] = std::make_shared<const Bytes>(r.value, r.value + r.value_bytes);
        respond(c, ResponseStatus::kOk);
        if (created) key_created(r.keys[0]);
        return;
      }
      case Op::kGet: {
        auto it = data.find(r.keys[0]);
        if (it != data.end()) {
          respond_value(c, it->second);
        } else {
          park(c, r.op, r.keys);
        }
        return;
      }
      case Op::kAdd: {
        const std::int64_t delta = static_cast<std::int64_t>(wire::load_u64(r.value));
        std::int64_t current = 0;
        auto it = data.find(r.keys[0]);
        const bool created = it == data.end();
        if (!created && !wire::parse_decimal_i64(it->second->data(), it->second->size(), current)) {
          respond(c, ResponseStatus::kNotANumber);
          return;
        }
        std::int64_t sum = 0;
        if (__builtin_add_overflow(current, delta, &sum)) {
          respond(c, ResponseStatus::kOverflow);
          return;
        }
        const std::string text = wire::format_decimal_i64(sum);
        data[r.keys[0]] = std::make_shared<const Bytes>(text.begin(), text.end());
        std::uint8_t bytes[8];
        wire::store_u64(bytes, static_cast<std::uint64_t>(sum));
        respond(c, ResponseStatus::kOk, bytes, 8);
        if (created) key_created(r.keys[0]);
        return;
      }
      case Op::kWait: {
        const bool all_exist =
            std::all_of(r.keys.begin(), r.keys.end(), [&](const std::string& k) { return data.count(k) != 0; });
        if (all_exist) {
          respond(c, ResponseStatus::kOk);
        } else {
          park(c, r.op, r.keys);
        }
        return;
      }
      case Op::kCheck: {
        respond_byte(
            c, std::all_of(r.keys.begin(), r.keys.end(), [&](const std::string& k) { return data.count(k) != 0; }));
        return;
      }
      case Op::kDelete: {
        respond_byte(c, data.erase(r.keys[0]) != 0);
        return;
      }
      case Op::kNumKeys: {
        respond_u64(c, data.size());
        return;
      }
    }
  }

  // Consumes every complete frame buffered for c, up to a parked request.
  void process(Connection* c) {
    if (c->closing || c->retiring) return;
    while (!c->closing && !c->parked) {
      const std::uint8_t* p = c->in.data() + c->in_begin;
      const std::size_t avail = c->buffered();
      if (!c->greeted) {
        if (avail < wire::kHelloBytes) break;
        const std::uint32_t magic = wire::load_u32(p);
        const std::uint32_t version = wire::load_u32(p + 4);
        if (magic != wire::kMagic) {
          char hex[16];
          std::snprintf(hex, sizeof hex, "0x%08x", magic);
          drop(c, std::string("wrong magic ") + hex + " (not a libpstar store client)");
          return;
        }
        const Bytes hello = wire::encode_hello();
        if (version != wire::kProtocolVersion) {
          log::warn(prefix() + "dropping peer " + c->peer + ": protocol version " + std::to_string(version) +
                    ", this server speaks " + std::to_string(wire::kProtocolVersion));
          dropped.fetch_add(1);
          retire(c, hello);
          return;
        }
        c->in_begin += wire::kHelloBytes;
        c->greeted = true;
        send(c, hello.data(), hello.size(), nullptr);
        continue;
      }
      if (avail < wire::kLengthPrefixBytes) break;
      const std::uint32_t body_bytes = wire::load_u32(p);
      if (body_bytes > wire::kMaxRequestBodyBytes) {
        drop(c, "frame announces " + std::to_string(body_bytes) + " bytes, over the limit of " +
                    std::to_string(wire::kMaxRequestBodyBytes));
        return;
      }
      if (avail - wire::kLengthPrefixBytes < body_bytes) break;
      wire::Request request;
      const std::string why = wire::parse_request(p + wire::kLengthPrefixBytes, body_bytes, request);
      if (!why.empty()) {
        drop(c, "malformed frame: " + why);
        return;
      }
      // The request's value still points into c->in: consuming only moves
      // in_begin, and nothing compacts the buffer before handle() returns.
      c->in_begin += wire::kLengthPrefixBytes + body_bytes;
      handle(c, request);
    }
    if (c->closing) return;
    compact(c);
    if (c->parked && c->buffered() > kMaxBufferedWhileParked) {
      stop_reading(c);
    } else {
      start_reading(c);
    }
    arm_stall_timer(c);
  }

  void compact(Connection* c) {
    if (c->in_begin == c->in_end) {
      c->in_begin = c->in_end = 0;
      if (c->in.size() > kKeepBufferBytes) Bytes().swap(c->in);
    } else if (c->in_begin > c->in.size() / 2) {
      std::memmove(c->in.data(), c->in.data() + c->in_begin, c->buffered());
      c->in_end -= c->in_begin;
      c->in_begin = 0;
    }
  }

  // The stall clock runs while the peer owes us bytes: before its hello, and
  // inside a frame (unless the frame waits behind a parked request).  Every
  // read that makes progress restarts it.
  void arm_stall_timer(Connection* c) {
    const bool owes_bytes = !c->greeted || (!c->parked && c->buffered() > 0);
    if (owes_bytes) {
      uv_timer_start(&c->stall_timer, on_stall, static_cast<std::uint64_t>(options.stall_timeout.count()), 0);
    } else {
      uv_timer_stop(&c->stall_timer);
    }
  }

  static void on_stall(uv_timer_t* timer) {
    auto* c = static_cast<Connection*>(timer->data);
    Impl* s = c->server;
    const std::string ms = std::to_string(s->options.stall_timeout.count());
    if (c->retiring) {
      s->close_connection(c);
    } else if (!c->greeted) {
      s->drop(c, "no complete handshake within " + ms + " ms (" + std::to_string(c->buffered()) + " bytes received)");
    } else {
      s->drop(
          c, "stalled mid-frame for " + ms + " ms (" + std::to_string(c->buffered()) + " bytes of the frame received)");
    }
  }

  // Answers a client of another protocol version with our hello, then closes
  // once the hello is sent (uv_shutdown waits for queued writes).
  void retire(Connection* c, const Bytes& hello) {
    c->retiring = true;
    stop_reading(c);
    send(c, hello.data(), hello.size(), nullptr);
    if (c->closing) return;
    auto* req = new uv_shutdown_t;
    const int rc = uv_shutdown(req, reinterpret_cast<uv_stream_t*>(&c->tcp), [](uv_shutdown_t* r, int) {
      auto* conn = static_cast<Connection*>(r->handle->data);
      conn->server->close_connection(conn);
      delete r;
    });
    if (rc < 0) {
      delete req;
      close_connection(c);
      return;
    }
    // If the peer never lets the hello drain, the stall timer closes it.
    uv_timer_start(&c->stall_timer, on_stall, static_cast<std::uint64_t>(options.stall_timeout.count()), 0);
  }

  void start_reading(Connection* c) {
    if (c->reading || c->closing || c->retiring) return;
    const int rc = uv_read_start(reinterpret_cast<uv_stream_t*>(&c->tcp), on_alloc, on_read);
    if (rc < 0) {
      log::warn(prefix() + "cannot read from " + c->peer + ": " + uv_message(rc));
      close_connection(c);
      return;
    }
    c->reading = true;
  }

  void stop_reading(Connection* c) {
    if (!c->reading) return;
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->tcp));
    c->reading = false;
  }

  void run_runnable() {
    while (!runnable.empty()) {
      Connection* c = runnable.back();
      runnable.pop_back();
      if (!c->closing) process(c);
    }
  }

  // ---- libuv callbacks ----
  static void on_alloc(uv_handle_t* handle, std::size_t suggested, uv_buf_t* buf) {
    auto* c = static_cast<Connection*>(handle->data);
    const std::size_t want = std::max(suggested, kReadChunkBytes);
    try {
      if (c->in.size() - c->in_end < want) c->in.resize(c->in_end + want);
    } catch (const std::bad_alloc&) {
      *buf = uv_buf_init(nullptr, 0);  // libuv reports UV_ENOBUFS to on_read
      return;
    }
    *buf = uv_buf_init(
        reinterpret_cast<char*>(c->in.data() + c->in_end),
        static_cast<unsigned>(std::min<std::size_t>(c->in.size() - c->in_end, std::numeric_limits<unsigned>::max())));
  }

  static void on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t*) {
    auto* c = static_cast<Connection*>(stream->data);
    Impl* s = c->server;
    if (c->closing) return;
    try {
      if (nread > 0) {
        c->in_end += static_cast<std::size_t>(nread);
        s->process(c);
        s->run_runnable();
      } else if (nread == UV_EOF) {
        if (c->buffered() > 0) {
          s->drop(c, "closed the connection mid-frame (" + std::to_string(c->buffered()) + " bytes pending)");
        } else {
          log::debug(s->prefix() + c->peer + " disconnected");
          s->close_connection(c);
        }
      } else if (nread == UV_ENOBUFS) {
        s->drop(c, "out of memory for its frame");
      } else if (nread < 0) {
        log::debug(s->prefix() + "read from " + c->peer + " failed: " + uv_message(static_cast<int>(nread)));
        s->close_connection(c);
      }
    } catch (const std::bad_alloc&) {
      s->drop(c, "out of memory while serving it");
      s->run_runnable();
    } catch (const std::exception& e) {
      // Nothing may unwind through libuv's C frames.
      s->drop(c, std::string("internal error: ") + e.what());
      s->run_runnable();
    }
  }

  static void on_connection(uv_stream_t* listener, int status) {
    Impl* s = static_cast<Impl*>(listener->data);
    if (status < 0) {
      log::warn(s->prefix() + "accept failed: " + uv_message(status));
      return;
    }
    auto* c = new Connection;
    c->server = s;
    uv_tcp_init(&s->loop, &c->tcp);
    uv_timer_init(&s->loop, &c->stall_timer);
    c->tcp.data = c;
    c->stall_timer.data = c;
    s->connections.insert(c);
    s->open.fetch_add(1);
    s->accepted.fetch_add(1);
    const int rc = uv_accept(listener, reinterpret_cast<uv_stream_t*>(&c->tcp));
    if (rc < 0) {
      log::warn(s->prefix() + "accept failed: " + uv_message(rc));
      s->close_connection(c);
      return;
    }
    // Requests and responses are small and strictly alternate: without
    // TCP_NODELAY, Nagle's algorithm and delayed ACKs add tens of ms each.
    uv_tcp_nodelay(&c->tcp, 1);
    uv_tcp_keepalive(&c->tcp, 1, kKeepaliveSeconds);
    sockaddr_storage addr{};
    int len = sizeof addr;
    c->peer = uv_tcp_getpeername(&c->tcp, reinterpret_cast<sockaddr*>(&addr), &len) == 0 ? address_name(addr)
                                                                                         : std::string("?");
    log::debug(s->prefix() + "connection from " + c->peer);
    s->start_reading(c);
    if (!c->closing) s->arm_stall_timer(c);
  }

  static void on_stop(uv_async_t* async) {
    Impl* s = static_cast<Impl*>(async->data);
    uv_close(reinterpret_cast<uv_handle_t*>(&s->listener), nullptr);
    const std::vector<Connection*> all(s->connections.begin(), s->connections.end());
    for (Connection* c : all) s->close_connection(c);
    s->runnable.clear();
    uv_close(reinterpret_cast<uv_handle_t*>(&s->stop_async), nullptr);
  }

  void run() {
    // libuv writes with write(2): a write to a peer that has closed raises
    // SIGPIPE, which would kill the host process.  SIGPIPE is sent to the
    // writing thread, so blocking it here turns it into EPIPE for this
    // thread alone, without touching the application's signal handling.
    sigset_t pipe_only;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, nullptr);
    uv_run(&loop, UV_RUN_DEFAULT);
  }
};

StoreServer::StoreServer(StoreServerOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  require(options.stall_timeout.count() > 0, PSTAR_ERR_INVALID_ARGUMENT,
          "store server: stall_timeout must be positive");
  s.options = std::move(options);
  const std::string wanted = s.options.host + ":" + std::to_string(s.options.port);

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(s.options.port);
  const int gai =
      getaddrinfo(s.options.host.empty() ? nullptr : s.options.host.c_str(), service.c_str(), &hints, &found);
  if (gai != 0 || found == nullptr) {
    throw Error(PSTAR_ERR_INVALID_ARGUMENT,
                "store server " + wanted + ": cannot resolve the host: " + gai_strerror(gai));
  }
  sockaddr_storage bind_addr{};
  std::memcpy(&bind_addr, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);

  int rc = uv_loop_init(&s.loop);
  if (rc < 0) throw Error(PSTAR_ERR_COMM, "store server " + wanted + ": uv_loop_init: " + uv_message(rc));
  uv_tcp_init(&s.loop, &s.listener);
  s.listener.data = &s;
  rc = uv_tcp_bind(&s.listener, reinterpret_cast<const sockaddr*>(&bind_addr), 0);
  const char* failed_call = "bind";
  if (rc == 0) {
    failed_call = "listen";
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(&s.listener), s.options.backlog, Impl::on_connection);
  }
  sockaddr_storage bound{};
  int bound_len = sizeof bound;
  if (rc == 0) {
    failed_call = "getsockname";
    rc = uv_tcp_getsockname(&s.listener, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  }
  if (rc < 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(&s.listener), nullptr);
    uv_run(&s.loop, UV_RUN_DEFAULT);
    uv_loop_close(&s.loop);
    throw Error(PSTAR_ERR_COMM, "store server " + wanted + ": " + failed_call + ": " + uv_message(rc));
  }
  s.port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  s.endpoint = s.options.host + ":" + std::to_string(s.port);
  uv_async_init(&s.loop, &s.stop_async, Impl::on_stop);
  s.stop_async.data = &s;
  s.thread = std::thread([&s] { s.run(); });
  log::info(s.prefix() + "listening");
}

StoreServer::~StoreServer() {
  try {
    stop();
  } catch (...) {
    // A destructor must not throw; stop() only logs.
  }
}

std::uint16_t StoreServer::port() const { return impl_->port; }
const std::string& StoreServer::endpoint() const { return impl_->endpoint; }

StoreServer::Stats StoreServer::stats() const {
  Stats st;
  st.accepted = impl_->accepted.load();
  st.dropped = impl_->dropped.load();
  st.open = impl_->open.load();
  return st;
}

void StoreServer::stop() {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.stop_mutex);
  if (!s.thread.joinable()) return;
  uv_async_send(&s.stop_async);
  s.thread.join();
  // Closed handles get their callbacks on the loop's next turn; run it until
  // nothing is left so that uv_loop_close finds the loop empty.
  uv_run(&s.loop, UV_RUN_DEFAULT);
  const int rc = uv_loop_close(&s.loop);
  if (rc < 0) log::error(s.prefix() + "uv_loop_close: " + uv_message(rc));
  log::info(s.prefix() + "stopped");
}

}  // namespace pstar::distributed
