// The rendezvous store (src/distributed/store): every operation through the client,
// concurrent clients, parked requests, the limits, timeouts, and peers that
// break the protocol (written here as raw sockets), which must be dropped
// without disturbing anyone else.  Every server binds port 0 on loopback.
// Assertions are on results and errors, never on durations; the timeouts
// below only bound how long a wrong implementation could hang.
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distributed/store/store_client.h"
#include "distributed/store/store_protocol.h"
#include "distributed/store/store_server.h"
#include "util/error.h"
#include "util/log.h"

using namespace pstar;
using namespace pstar::distributed;
using namespace std::chrono_literals;
using Bytes = std::vector<std::uint8_t>;

namespace {

// ---- helpers ----------------------------------------------------------------

Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string text_of(const Bytes& b) { return std::string(b.begin(), b.end()); }

std::unique_ptr<StoreServer> start_server(std::chrono::milliseconds stall_timeout = 30s) {
  StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.stall_timeout = stall_timeout;
  return std::make_unique<StoreServer>(o);
}

StoreClientOptions client_options(std::uint16_t port, std::chrono::milliseconds timeout = 10s) {
  StoreClientOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout = 10s;
  o.timeout = timeout;
  return o;
}

std::unique_ptr<StoreClient> connect_client(const StoreServer& server, std::chrono::milliseconds timeout = 10s) {
  return std::make_unique<StoreClient>(client_options(server.port(), timeout));
}

// Runs f, which must throw pstar::Error with `status`; returns its message.
template <class F>
std::string error_of(F&& f, pstar_status status) {
  try {
    f();
  } catch (const Error& e) {
    cr_assert_eq(e.status(), status, "status %d, expected %d: %s", e.status(), status, e.what());
    return e.what();
  }
  cr_assert_fail("no pstar::Error thrown");
  return {};
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A port nothing listens on (the kernel's choice, released at once).
std::uint16_t unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  cr_assert_eq(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  cr_assert_eq(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Captures the library's log records (the server logs why it drops a peer).
struct LogCapture {
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<std::string>& lines() {
    static std::vector<std::string> l;
    return l;
  }
  static void record(pstar_log_level, const char* message, void*) {
    std::lock_guard<std::mutex> lock(mutex());
    lines().emplace_back(message);
  }
  static void install() { log::set_callback(record, nullptr, PSTAR_LOG_WARN); }
  // Whether a record containing `needle` arrived (the server logs from its
  // own thread, a moment after the peer sees the connection close).
  static bool saw(const std::string& needle) {
    for (int i = 0; i < 500; ++i) {
      {
        std::lock_guard<std::mutex> lock(mutex());
        for (const std::string& l : lines()) {
          if (contains(l, needle)) return true;
        }
      }
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
};

// A peer that speaks raw bytes to the server, well-formed or not.
class RawPeer {
 public:
  explicit RawPeer(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    cr_assert_eq(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0, "raw connect: %s", strerror(errno));
  }
  ~RawPeer() { ::close(fd_); }
  RawPeer(const RawPeer&) = delete;
  RawPeer& operator=(const RawPeer&) = delete;

  // Errors are ignored: the server may already have dropped us.
  void send_bytes(const Bytes& b) { (void)::send(fd_, b.data(), b.size(), MSG_NOSIGNAL); }

  // Reads exactly n bytes; false on close or after timeout.
  bool read_exact(std::uint8_t* p, std::size_t n, std::chrono::milliseconds timeout = 10s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (n > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p1{fd_, POLLIN, 0};
      if (poll(&p1, 1, static_cast<int>(left.count())) <= 0) return false;
      const ssize_t k = ::recv(fd_, p, n, 0);
      if (k <= 0) return false;
      p += k;
      n -= static_cast<std::size_t>(k);
    }
    return true;
  }

  void handshake() {
    send_bytes(wire::encode_hello());
    std::uint8_t reply[8];
    cr_assert(read_exact(reply, 8), "no hello from the server");
    cr_assert_eq(wire::load_u32(reply), wire::kMagic);
    cr_assert_eq(wire::load_u32(reply + 4), wire::kProtocolVersion);
  }

  // Reads one response: status and payload.
  bool read_response(std::uint8_t& status, Bytes& payload, std::chrono::milliseconds timeout = 10s) {
    std::uint8_t head[8];
    if (!read_exact(head, 8, timeout)) return false;
    status = head[4];
    payload.resize(wire::load_u32(head) - 4);
    return read_exact(payload.data(), payload.size(), timeout);
  }

  // Whether the server closes the connection (EOF or reset) within the
  // timeout; data sent before is discarded.
  bool closed_within(std::chrono::milliseconds timeout = 10s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::uint8_t sink[4096];
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      const int rc = poll(&p, 1, static_cast<int>(left.count()));
      if (rc == 0) return false;
      if (rc < 0) continue;
      const ssize_t k = ::recv(fd_, sink, sizeof sink, 0);
      if (k == 0) return true;
      if (k < 0 && errno == ECONNRESET) return true;
    }
  }

 private:
  int fd_ = -1;
};

// A whole request frame, well-formed.
Bytes request_frame(wire::Op op, const std::vector<std::string>& keys, const Bytes& value = {}) {
  Bytes f = wire::encode_request_head(op, keys, value.size());
  f.insert(f.end(), value.begin(), value.end());
  return f;
}

Bytes concat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// The server still answers a well-behaved client.
void assert_serves_others(const StoreServer& server, const std::string& tag) {
  auto c = connect_client(server);
  c->set("alive/" + tag, bytes_of(tag));
  cr_assert_eq(text_of(c->get("alive/" + tag)), tag, "%s: the server no longer serves others", tag.c_str());
}

// A raw peer that has done the handshake and then sends `frame` must be
// dropped, with a log record containing `reason`, while others are served.
void assert_frame_dropped(const StoreServer& server, const Bytes& frame, const std::string& reason,
                          const std::string& tag) {
  RawPeer peer(server.port());
  peer.handshake();
  peer.send_bytes(frame);
  cr_assert(peer.closed_within(), "%s: the peer was not dropped", tag.c_str());
  cr_assert(LogCapture::saw(reason), "%s: no log record containing \"%s\"", tag.c_str(), reason.c_str());
  assert_serves_others(server, tag);
}

}  // namespace

// ---- operations -------------------------------------------------------------

Test(store, port_zero_picks_distinct_free_ports) {
  auto a = start_server();
  auto b = start_server();
  cr_assert_neq(a->port(), 0);
  cr_assert_neq(b->port(), 0);
  cr_assert_neq(a->port(), b->port());
  cr_assert(contains(a->endpoint(), ":" + std::to_string(a->port())));
  auto ca = connect_client(*a);
  auto cb = connect_client(*b);
  ca->set("k", bytes_of("on a"));
  cr_assert_not(cb->check({"k"}), "the two servers share state");
  cr_assert(contains(ca->endpoint(), std::to_string(a->port())));
}

Test(store, set_get_overwrite_binary_and_empty) {
  auto server = start_server();
  auto c = connect_client(*server);
  c->set("a", bytes_of("hello"));
  cr_assert_eq(text_of(c->get("a")), "hello");
  c->set("a", bytes_of("again"));
  cr_assert_eq(text_of(c->get("a")), "again");
  const Bytes binary = {0, 1, 0xff, 0, 0x80, '\n'};
  c->set("bin", binary);
  cr_assert(c->get("bin") == binary);
  c->set("empty value", Bytes{});
  cr_assert(c->get("empty value").empty());
  c->set("", bytes_of("empty key"));
  cr_assert_eq(text_of(c->get("")), "empty key");
  const std::string binary_key("k\0ey", 4);
  c->set(binary_key, bytes_of("nul in the key"));
  cr_assert_eq(text_of(c->get(binary_key)), "nul in the key");
  cr_assert_not(c->check({"k"}), "a key with a NUL must not match its prefix");
  cr_assert_eq(c->num_keys(), 5u);
  // Another client sees the same data.
  auto other = connect_client(*server);
  cr_assert_eq(text_of(other->get("a")), "again");
}

Test(store, add_counts_from_zero_in_decimal_text) {
  auto server = start_server();
  auto c = connect_client(*server);
  cr_assert_eq(c->add("n", 5), 5);
  cr_assert_eq(c->add("n", -7), -2);
  cr_assert_eq(c->add("n", 0), -2);
  cr_assert_eq(text_of(c->get("n")), "-2");
  c->set("m", bytes_of("40"));
  cr_assert_eq(c->add("m", 2), 42);
  c->set("min", bytes_of("-9223372036854775808"));
  cr_assert_eq(c->add("min", 0), INT64_MIN);

  c->set("word", bytes_of("abc"));
  std::string msg = error_of([&] { c->add("word", 1); }, PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert(contains(msg, "decimal"), "%s", msg.c_str());
  cr_assert(contains(msg, "add(\"word\")"), "%s", msg.c_str());
  cr_assert_eq(text_of(c->get("word")), "abc", "a failed add changed the value");

  c->set("big", bytes_of("9223372036854775807"));
  msg = error_of([&] { c->add("big", 1); }, PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert(contains(msg, "overflow"), "%s", msg.c_str());
  cr_assert_eq(text_of(c->get("big")), "9223372036854775807");
  c->set("too long", bytes_of("9223372036854775808"));
  error_of([&] { c->add("too long", 0); }, PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert_eq(server->stats().dropped, 0u);
}

Test(store, concurrent_adds_sum_exactly, .timeout = 60) {
  auto server = start_server();
  constexpr int kThreads = 8;
  constexpr int kAddsEach = 250;
  std::vector<std::vector<std::int64_t>> seen(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        auto c = connect_client(*server);
        for (int i = 0; i < kAddsEach; ++i) seen[t].push_back(c->add("counter", 1));
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) cr_assert(errors[t].empty(), "thread %d: %s", t, errors[t].c_str());
  std::vector<std::int64_t> all;
  for (const auto& s : seen) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  for (std::size_t i = 0; i < all.size(); ++i) {
    cr_assert_eq(all[i], static_cast<std::int64_t>(i + 1), "the adds did not return each of 1..%d exactly once",
                 kThreads * kAddsEach);
  }
  auto c = connect_client(*server);
  cr_assert_eq(text_of(c->get("counter")), std::to_string(kThreads * kAddsEach));
}

Test(store, get_waits_until_another_client_sets, .timeout = 30) {
  auto server = start_server();
  auto getter = connect_client(*server);
  auto setter = connect_client(*server);
  std::atomic<bool> done{false};
  std::string got, error;
  std::thread t([&] {
    try {
      got = text_of(getter->get("late", 20s));
    } catch (const std::exception& e) {
      error = e.what();
    }
    done = true;
  });
  std::this_thread::sleep_for(100ms);
  const bool returned_early = done.load();
  setter->set("late", bytes_of("value"));
  t.join();
  cr_assert_not(returned_early, "get returned before the key was set: %s", error.c_str());
  cr_assert(error.empty(), "%s", error.c_str());
  cr_assert_eq(got, "value");
}

Test(store, get_times_out_and_the_client_recovers, .timeout = 30) {
  LogCapture::install();
  auto server = start_server();
  auto c = connect_client(*server);
  const std::string msg = error_of([&] { c->get("never", 200ms); }, PSTAR_ERR_COMM);
  cr_assert(contains(msg, "timed out"), "%s", msg.c_str());
  cr_assert(contains(msg, "get(\"never\")"), "%s", msg.c_str());
  cr_assert(contains(msg, "127.0.0.1:" + std::to_string(server->port())), "%s", msg.c_str());
  // The same client reconnects for its next call.
  c->set("after", bytes_of("x"));
  cr_assert_eq(text_of(c->get("after")), "x");
  // Setting the key the timed-out get was parked on must not trip the server
  // over the closed connection.
  auto other = connect_client(*server);
  other->set("never", bytes_of("now"));
  cr_assert_eq(text_of(other->get("never")), "now");
  cr_assert_eq(server->stats().dropped, 0u, "a client that timed out is not a bad peer");
}

Test(store, wait_blocks_until_all_keys_exist, .timeout = 30) {
  auto server = start_server();
  auto waiter = connect_client(*server);
  auto setter = connect_client(*server);
  std::atomic<bool> done{false};
  std::string error;
  std::thread t([&] {
    try {
      waiter->wait({"a", "b", "c"}, 20s);
    } catch (const std::exception& e) {
      error = e.what();
    }
    done = true;
  });
  setter->set("a", bytes_of("1"));
  setter->add("b", 1);
  std::this_thread::sleep_for(100ms);
  const bool returned_early = done.load();
  setter->set("c", bytes_of("3"));
  t.join();
  cr_assert_not(returned_early, "wait returned with a key missing");
  cr_assert(error.empty(), "%s", error.c_str());
  // All present: returns at once; one missing: times out.
  waiter->wait({"a", "b", "c"}, 5s);
  const std::string msg = error_of([&] { waiter->wait({"a", "missing"}, 200ms); }, PSTAR_ERR_COMM);
  cr_assert(contains(msg, "timed out"), "%s", msg.c_str());
  cr_assert(contains(msg, "wait(\"a\", \"missing\")"), "%s", msg.c_str());
  waiter->wait({}, 1ms);  // nothing to wait for
}

Test(store, wait_sees_a_key_deleted_and_set_again, .timeout = 30) {
  auto server = start_server();
  auto waiter = connect_client(*server);
  auto setter = connect_client(*server);
  std::atomic<bool> done{false};
  std::string error;
  std::thread t([&] {
    try {
      waiter->wait({"x", "y"}, 20s);
    } catch (const std::exception& e) {
      error = e.what();
    }
    done = true;
  });
  std::this_thread::sleep_for(50ms);
  setter->set("x", bytes_of("1"));
  cr_assert(setter->erase("x"));
  setter->set("y", bytes_of("2"));
  std::this_thread::sleep_for(100ms);
  const bool returned_early = done.load();
  setter->set("x", bytes_of("1 again"));
  t.join();
  cr_assert_not(returned_early, "wait returned while x was deleted");
  cr_assert(error.empty(), "%s", error.c_str());
}

Test(store, check_erase_and_num_keys) {
  auto server = start_server();
  auto c = connect_client(*server);
  cr_assert(c->check({}));
  cr_assert_not(c->check({"p"}));
  cr_assert_eq(c->num_keys(), 0u);
  c->set("p", bytes_of("1"));
  cr_assert(c->check({"p"}));
  cr_assert_not(c->check({"p", "q"}));
  c->set("q", bytes_of("2"));
  cr_assert(c->check({"p", "q"}));
  cr_assert_eq(c->num_keys(), 2u);
  cr_assert(c->erase("p"));
  cr_assert_not(c->erase("p"));
  cr_assert_not(c->check({"p"}));
  cr_assert_eq(c->num_keys(), 1u);
  cr_assert_not(c->erase("never set"));
}

// ---- limits -----------------------------------------------------------------

Test(store, key_and_value_limits, .timeout = 60) {
  auto server = start_server();
  auto c = connect_client(*server);
  const std::string longest_key(wire::kMaxKeyBytes, 'k');
  c->set(longest_key, bytes_of("ok"));
  cr_assert_eq(text_of(c->get(longest_key)), "ok");

  const std::string too_long_key(wire::kMaxKeyBytes + 1, 'k');
  std::string msg = error_of([&] { c->set(too_long_key, bytes_of("x")); }, PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert(contains(msg, "exceeds the limit"), "%s", msg.c_str());
  cr_assert(contains(msg, std::to_string(server->port())), "%s", msg.c_str());
  error_of([&] { c->get(too_long_key); }, PSTAR_ERR_INVALID_ARGUMENT);
  error_of([&] { c->wait({"fine", too_long_key}); }, PSTAR_ERR_INVALID_ARGUMENT);

  Bytes largest(wire::kMaxValueBytes);
  for (std::size_t i = 0; i < largest.size(); i += 4093) largest[i] = static_cast<std::uint8_t>(i * 7);
  c->set("largest", largest);
  cr_assert(c->get("largest") == largest, "the largest value did not round-trip");

  largest.push_back(1);
  msg = error_of([&] { c->set("too large", largest); }, PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert(contains(msg, "value of"), "%s", msg.c_str());
  largest = Bytes();

  // The refusals happened in the client: its connection and the server are
  // fine.
  c->set("after", bytes_of("x"));
  cr_assert_eq(text_of(c->get("after")), "x");
  assert_serves_others(*server, "limits");
  cr_assert_eq(server->stats().dropped, 0u);
}

// ---- bad peers --------------------------------------------------------------

Test(store, garbage_instead_of_a_handshake_is_dropped) {
  LogCapture::install();
  auto server = start_server();
  auto good = connect_client(*server);
  good->set("before", bytes_of("1"));
  RawPeer peer(server->port());
  peer.send_bytes(bytes_of("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  cr_assert(peer.closed_within(), "the peer was not dropped");
  cr_assert(LogCapture::saw("wrong magic"));
  cr_assert(LogCapture::saw("dropping peer 127.0.0.1:"));
  // The client connected before is unaffected.
  cr_assert_eq(text_of(good->get("before")), "1");
  assert_serves_others(*server, "garbage");
  cr_assert_eq(server->stats().dropped, 1u);
}

Test(store, another_protocol_version_gets_the_servers_hello_then_close) {
  LogCapture::install();
  auto server = start_server();
  RawPeer peer(server->port());
  peer.send_bytes(wire::encode_hello(wire::kMagic, 99));
  std::uint8_t reply[8];
  cr_assert(peer.read_exact(reply, 8), "no hello back");
  cr_assert_eq(wire::load_u32(reply), wire::kMagic);
  cr_assert_eq(wire::load_u32(reply + 4), wire::kProtocolVersion);
  cr_assert(peer.closed_within());
  cr_assert(LogCapture::saw("protocol version 99"));
  assert_serves_others(*server, "version");
}

Test(store, frame_announcing_a_huge_length_is_dropped) {
  LogCapture::install();
  auto server = start_server();
  Bytes frame(4);
  wire::store_u32(frame.data(), 0xffffffffu);
  frame.resize(64, 0xab);
  assert_frame_dropped(*server, frame, "over the limit", "huge length");
  Bytes just_over(4);
  wire::store_u32(just_over.data(), static_cast<std::uint32_t>(wire::kMaxRequestBodyBytes + 1));
  assert_frame_dropped(*server, just_over, "over the limit", "just over");
}

Test(store, malformed_frames_are_dropped) {
  LogCapture::install();
  auto server = start_server();
  auto good = connect_client(*server);
  good->set("kept", bytes_of("1"));

  Bytes unknown_op = request_frame(wire::Op::kGet, {"k"});
  unknown_op[4] = 77;
  assert_frame_dropped(*server, unknown_op, "unknown op 77", "unknown op");

  Bytes reserved = request_frame(wire::Op::kGet, {"k"});
  reserved[6] = 1;
  assert_frame_dropped(*server, reserved, "reserved", "reserved");

  Bytes key_past_end = request_frame(wire::Op::kGet, {"k"});
  wire::store_u32(key_past_end.data() + 12, 1000);  // the key's length
  assert_frame_dropped(*server, key_past_end, "malformed frame", "key past the end");

  Bytes many_keys = request_frame(wire::Op::kWait, {"k"});
  wire::store_u32(many_keys.data() + 8, 0x40000000u);  // key_count
  assert_frame_dropped(*server, many_keys, "key_count", "key count");

  Bytes value_mismatch = request_frame(wire::Op::kSet, {"k"}, bytes_of("value"));
  value_mismatch.push_back('!');
  wire::store_u32(value_mismatch.data(), wire::load_u32(value_mismatch.data()) + 1);
  assert_frame_dropped(*server, value_mismatch, "disagrees", "value length");

  assert_frame_dropped(*server, request_frame(wire::Op::kGet, {"k"}, bytes_of("v")), "get takes no value",
                       "get with a value");
  assert_frame_dropped(*server, request_frame(wire::Op::kAdd, {"k"}, bytes_of("1")), "8-byte value",
                       "add with 1 byte");
  assert_frame_dropped(*server, request_frame(wire::Op::kCheck, {}), "at least 1 key", "check without keys");
  assert_frame_dropped(*server, request_frame(wire::Op::kSet, {std::string(wire::kMaxKeyBytes + 1, 'k')}),
                       "exceeds the limit", "oversized key");

  Bytes short_body(4);
  wire::store_u32(short_body.data(), 3);
  short_body.insert(short_body.end(), {1, 0, 0});
  assert_frame_dropped(*server, short_body, "shorter than the fixed fields", "short body");

  cr_assert_eq(text_of(good->get("kept")), "1");
  cr_assert_eq(server->stats().dropped, 10u);
  // "kept" and one "alive/..." per case: nothing else was applied.
  cr_assert_eq(good->num_keys(), 1u + 10u, "a dropped frame changed the store");
}

Test(store, half_a_frame_then_silence_is_dropped, .timeout = 30) {
  LogCapture::install();
  auto server = start_server(300ms);
  RawPeer peer(server->port());
  peer.handshake();
  const Bytes frame = request_frame(wire::Op::kSet, {"stalled"}, Bytes(100, 7));
  peer.send_bytes(Bytes(frame.begin(), frame.begin() + 40));
  // While that peer stalls, others are served.
  assert_serves_others(*server, "during the stall");
  cr_assert(peer.closed_within(), "the stalled peer was not dropped");
  cr_assert(LogCapture::saw("stalled mid-frame"));
  auto c = connect_client(*server);
  cr_assert_not(c->check({"stalled"}), "half a frame was applied");
}

Test(store, silent_peer_without_a_handshake_is_dropped, .timeout = 30) {
  LogCapture::install();
  auto server = start_server(300ms);
  RawPeer silent(server->port());
  RawPeer half_hello(server->port());
  half_hello.send_bytes(Bytes{0x50, 0x53});
  cr_assert(silent.closed_within());
  cr_assert(half_hello.closed_within());
  cr_assert(LogCapture::saw("no complete handshake"));
  assert_serves_others(*server, "silent");
}

Test(store, idle_client_between_frames_is_kept, .timeout = 30) {
  auto server = start_server(100ms);
  auto c = connect_client(*server);
  c->set("k", bytes_of("v"));
  std::this_thread::sleep_for(400ms);  // idle well past the stall timeout
  cr_assert_eq(text_of(c->get("k")), "v");
  cr_assert_eq(server->stats().dropped, 0u);
}

Test(store, pipelined_requests_are_answered_in_order_behind_a_parked_get, .timeout = 30) {
  auto server = start_server();
  RawPeer peer(server->port());
  peer.handshake();
  peer.send_bytes(concat({request_frame(wire::Op::kSet, {"k"}, bytes_of("v")), request_frame(wire::Op::kGet, {"k"}),
                          request_frame(wire::Op::kGet, {"later"}), request_frame(wire::Op::kNumKeys, {})}));
  std::uint8_t status = 0xff;
  Bytes payload;
  cr_assert(peer.read_response(status, payload));
  cr_assert_eq(status, 0);
  cr_assert(payload.empty());
  cr_assert(peer.read_response(status, payload));
  cr_assert_eq(text_of(payload), "v");
  // The get of "later" is parked, and the num_keys behind it waits too.
  cr_assert_not(peer.read_response(status, payload, 200ms), "an answer overtook the parked get");
  auto c = connect_client(*server);
  c->set("later", bytes_of("w"));
  cr_assert(peer.read_response(status, payload));
  cr_assert_eq(text_of(payload), "w");
  cr_assert(peer.read_response(status, payload));
  cr_assert_eq(payload.size(), 8u);
  cr_assert_eq(wire::load_u64(payload.data()), 2u);
}

// ---- lifecycle --------------------------------------------------------------

Test(store, stop_while_clients_wait_fails_them_without_a_hang, .timeout = 30) {
  auto server = start_server();
  auto getter = connect_client(*server, 60s);
  auto waiter = connect_client(*server, 60s);
  std::string get_error, wait_error;
  std::thread t1([&] {
    try {
      getter->get("never");
    } catch (const Error& e) {
      get_error = std::to_string(e.status()) + " " + e.what();
    }
  });
  std::thread t2([&] {
    try {
      waiter->wait({"never", "either"});
    } catch (const Error& e) {
      wait_error = std::to_string(e.status()) + " " + e.what();
    }
  });
  std::this_thread::sleep_for(200ms);
  const std::string endpoint = "127.0.0.1:" + std::to_string(server->port());
  server->stop();
  t1.join();
  t2.join();
  const std::string comm = std::to_string(PSTAR_ERR_COMM) + " ";
  cr_assert(contains(get_error, comm) && contains(get_error, endpoint), "get: %s", get_error.c_str());
  cr_assert(contains(wait_error, comm) && contains(wait_error, endpoint), "wait: %s", wait_error.c_str());
  cr_assert(contains(get_error, "closed"), "%s", get_error.c_str());
  server->stop();  // idempotent
  // Without a server, the next call fails (after retrying up to its timeout).
  error_of([&] { getter->get("never", 300ms); }, PSTAR_ERR_COMM);
}

Test(store, destructor_stops_a_server_with_connected_clients, .timeout = 30) {
  auto server = start_server();
  auto c = connect_client(*server, 500ms);
  c->set("k", bytes_of("v"));
  server.reset();
  const std::string msg = error_of([&] { c->get("k"); }, PSTAR_ERR_COMM);
  cr_assert(contains(msg, "get(\"k\")"), "%s", msg.c_str());
}

Test(store, client_started_before_the_server_connects_once_it_listens, .timeout = 30) {
  const std::uint16_t port = unused_port();
  std::unique_ptr<StoreClient> client;
  std::string error;
  std::thread t([&] {
    try {
      client = std::make_unique<StoreClient>(client_options(port));
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(300ms);
  StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  StoreServer server(o);
  cr_assert_eq(server.port(), port);
  t.join();
  cr_assert(error.empty(), "%s", error.c_str());
  client->set("k", bytes_of("v"));
  cr_assert_eq(text_of(client->get("k")), "v");
}

Test(store, connect_gives_up_at_its_deadline, .timeout = 30) {
  const std::uint16_t port = unused_port();
  StoreClientOptions o = client_options(port);
  o.connect_timeout = 300ms;
  const std::string msg = error_of([&] { StoreClient c(o); }, PSTAR_ERR_COMM);
  cr_assert(contains(msg, "127.0.0.1:" + std::to_string(port)), "%s", msg.c_str());
  cr_assert(contains(msg, "connect"), "%s", msg.c_str());
  cr_assert(contains(msg, "could not reach"), "%s", msg.c_str());
}

Test(store, bad_options_are_refused) {
  StoreClientOptions o = client_options(1);
  o.timeout = 0ms;
  error_of([&] { StoreClient c(o); }, PSTAR_ERR_INVALID_ARGUMENT);
  StoreServerOptions s;
  s.host = "127.0.0.1";
  s.stall_timeout = 0ms;
  error_of([&] { StoreServer server(s); }, PSTAR_ERR_INVALID_ARGUMENT);
  auto first = start_server();
  StoreServerOptions same;
  same.host = "127.0.0.1";
  same.port = first->port();
  const std::string msg = error_of([&] { StoreServer second(same); }, PSTAR_ERR_COMM);
  cr_assert(contains(msg, std::to_string(first->port())), "%s", msg.c_str());
}

// A listener that answers the handshake the way a wrong server would.
static void fake_server_answering(const Bytes& reply, std::uint16_t& port_out, std::thread& thread, int& fd_out) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_assert_eq(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  cr_assert_eq(::listen(fd, 4), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port_out = ntohs(a.sin_port);
  fd_out = fd;
  thread = std::thread([fd, reply] {
    const int conn = ::accept(fd, nullptr, nullptr);
    if (conn < 0) return;
    std::uint8_t hello[8];
    std::size_t got = 0;
    while (got < 8) {
      const ssize_t k = ::recv(conn, hello + got, 8 - got, 0);
      if (k <= 0) break;
      got += static_cast<std::size_t>(k);
    }
    (void)::send(conn, reply.data(), reply.size(), MSG_NOSIGNAL);
    std::this_thread::sleep_for(100ms);
    ::close(conn);
  });
}

Test(store, client_refuses_a_server_of_another_version_or_protocol, .timeout = 30) {
  for (const auto& [reply, expected] :
       std::vector<std::pair<Bytes, std::string>>{{wire::encode_hello(wire::kMagic, 2), "protocol version 2"},
                                                  {wire::encode_hello(0x12345678u, 1), "not a libpstar store"}}) {
    std::uint16_t port = 0;
    std::thread t;
    int fd = -1;
    fake_server_answering(reply, port, t, fd);
    const std::string msg = error_of([&] { StoreClient c(client_options(port)); }, PSTAR_ERR_COMM);
    t.join();
    ::close(fd);
    cr_assert(contains(msg, expected), "%s", msg.c_str());
  }
}

// A flood of connections (bounded: 200, loopback) that never say anything:
// a well-behaved client is served while they sit there, every one of them
// is dropped at the stall timeout, and the server goes on serving.
Test(store, a_flood_of_silent_connections_does_not_starve_clients, .timeout = 60) {
  LogCapture::install();
  auto server = start_server(300ms);
  std::vector<std::unique_ptr<RawPeer>> flood;
  for (int i = 0; i < 200; ++i) flood.push_back(std::make_unique<RawPeer>(server->port()));
  auto c = connect_client(*server);
  c->set("during", bytes_of("the flood"));
  cr_assert_eq(text_of(c->get("during")), "the flood");
  for (auto& p : flood) cr_assert(p->closed_within());
  cr_assert_geq(server->stats().dropped, 200u);
  assert_serves_others(*server, "flood");
}
