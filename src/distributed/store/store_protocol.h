// Wire protocol of the rendezvous store: the TCP key-value store through
// which the ranks of a data-parallel run find each other (the NCCL unique id,
// Gloo's addresses, barriers).  Shared by the server (store_server.h, libuv)
// and the client (store_client.h, a plain socket); nothing here does I/O.
//
// Every integer on the wire is unsigned, fixed-width and little-endian,
// written and read byte by byte (no struct is ever sent as such), so the
// layout does not depend on the host's byte order or padding.
//
// 1. Handshake.  The client opens with 8 bytes:
//
//      offset  size  field
//      0       4     magic     kMagic ("PSTS" in wire order)
//      4       4     version   kProtocolVersion
//
//    The server answers with the same 8 bytes carrying its own version.  A
//    wrong magic is dropped without an answer (the peer is not a store
//    client); a known magic with another version gets the server's hello and
//    is then closed, so that the client can name both versions in its error.
//    Nothing else is authenticated: the store trusts the network it listens
//    on, like the collectives that use it.
//
// 2. Requests, after the handshake, one frame each:
//
//      offset  size  field
//      0       4     body_bytes   bytes that follow this field
//      4       1     op           an Op below
//      5       3     reserved     zero
//      8       4     key_count
//      12      ...   key_count times { u32 key_bytes, key_bytes bytes }
//      ...     4     value_bytes
//      ...     ...   value_bytes bytes
//
//    The fields must use exactly body_bytes; each op has a fixed shape
//    (request_shape_error()).  Keys are arbitrary bytes (empty allowed).
//
// 3. Responses, one per request, in request order:
//
//      offset  size  field
//      0       4     body_bytes   bytes that follow this field (>= 4)
//      4       1     status       a ResponseStatus below
//      5       3     reserved     zero
//      8       ...   payload      body_bytes - 4 bytes, by op:
//                    SET, WAIT: none;  GET: the value;  ADD: the new value
//                    (8 bytes, int64);  CHECK, DELETE: one byte, 0 or 1;
//                    NUM_KEYS: 8 bytes, u64.
//
//    An int64 on the wire is its two's complement as a little-endian u64.
//    ADD's request value is the delta, 8 bytes.
//
// ADD keeps its counter as decimal ASCII text (an optional '-' and digits,
// what std::to_string writes), so a GET of a counter reads "42", and a SET of
// decimal text can be added to.  A missing key counts as 0.  A value that is
// not such text, or a sum that overflows int64, is answered with an error
// status and changes nothing.
//
// A frame whose body_bytes exceeds kMaxRequestBodyBytes is refused as soon
// as its first 4 bytes arrive, before any of the body is buffered; the server
// drops the connection (it cannot resynchronise on a stream it will not
// read).  Malformed frames are dropped the same way.  Limits are enforced by
// the client before sending too, so a well-behaved caller gets an error
// instead of a dropped connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pstar::distributed::wire {

// "PSTS" (libpstar store) as the 4 bytes appear on the wire.
constexpr std::uint32_t kMagic = 0x53545350u;
constexpr std::uint32_t kProtocolVersion = 1;
constexpr std::size_t kHelloBytes = 8;

// Largest key, in bytes.  Keys are names ("nccl/unique_id", "gloo/3/addr");
// 4 KiB leaves room for generated prefixes and keeps the bytes a WAIT parks
// small.
constexpr std::size_t kMaxKeyBytes = 4096;
// Largest value, in bytes.  What the store carries is small (a 128-byte NCCL
// id, socket addresses, counters); 64 MiB is far above that while bounding
// what one connection can make the server buffer.  A value of this size
// crosses loopback in tens of milliseconds, well inside any timeout.
constexpr std::size_t kMaxValueBytes = std::size_t{64} << 20;

// Fixed fields of a request body: op, 3 reserved bytes, key_count,
// value_bytes.
constexpr std::size_t kRequestFixedBytes = 12;
// Largest request body (after the 4-byte length prefix), in bytes: a SET of
// the largest key and the largest value.  A WAIT or CHECK may spend the same
// budget on many keys (each within kMaxKeyBytes).
constexpr std::size_t kMaxRequestBodyBytes = kRequestFixedBytes + 4 + kMaxKeyBytes + kMaxValueBytes;
// Status and reserved bytes of a response body.
constexpr std::size_t kResponseFixedBytes = 4;
// Largest response body, in bytes: a GET of the largest value.
constexpr std::size_t kMaxResponseBodyBytes = kResponseFixedBytes + kMaxValueBytes;

// The length prefix of every frame, in bytes.
constexpr std::size_t kLengthPrefixBytes = 4;

enum class Op : std::uint8_t {
  kSet = 1,      // 1 key, a value: store (replace) the value
  kGet = 2,      // 1 key: the value, parked until the key exists
  kAdd = 3,      // 1 key, an 8-byte int64 value: add it, answer the sum
  kWait = 4,     // >= 1 keys: answer once all exist (parked until then)
  kCheck = 5,    // >= 1 keys: do all exist now
  kDelete = 6,   // 1 key: remove it, answer whether it existed
  kNumKeys = 7,  // no key: how many keys are stored
};

enum class ResponseStatus : std::uint8_t {
  kOk = 0,
  kNotANumber = 1,  // ADD on a value that is not decimal int64 text
  kOverflow = 2,    // ADD whose sum does not fit in int64
};

const char* op_name(Op op);
bool is_known_op(std::uint8_t op);

inline void store_u32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline void store_u64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline std::uint32_t load_u32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t{p[i]} << (8 * i);
  return v;
}
inline std::uint64_t load_u64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{p[i]} << (8 * i);
  return v;
}

// The 8-byte hello for `version` (clients send kProtocolVersion; tests send
// others).
std::vector<std::uint8_t> encode_hello(std::uint32_t magic = kMagic, std::uint32_t version = kProtocolVersion);

// Body bytes of a request with these keys and a value of `value_bytes`.
std::size_t request_body_bytes(const std::vector<std::string>& keys, std::size_t value_bytes);

// Everything of a request frame up to and including value_bytes: the length
// prefix, the fixed fields and the keys.  The value's bytes follow it on the
// wire (sent separately, so a large value is not copied).  The caller checks
// the limits first.
std::vector<std::uint8_t> encode_request_head(Op op, const std::vector<std::string>& keys, std::size_t value_bytes);

// A request body as parsed by the server.  `value` points into the buffer
// that was parsed and is valid only as long as it is.
struct Request {
  Op op = Op::kSet;
  std::vector<std::string> keys;
  const std::uint8_t* value = nullptr;
  std::size_t value_bytes = 0;
};

// Parses one request body (the bytes after the length prefix).  Returns an
// empty string on success, else why the frame is malformed.
std::string parse_request(const std::uint8_t* body, std::size_t body_bytes, Request& out);

// Why a request of this op, key count and value size is malformed, or an
// empty string if it has the op's shape.
std::string request_shape_error(Op op, std::size_t key_count, std::size_t value_bytes);

// Decimal int64 text as ADD stores it.  parse_decimal_i64 accepts an
// optional '-' followed by one or more ASCII digits (leading zeros allowed:
// "007" is 7) whose value fits in int64; no sign '+', no spaces.
bool parse_decimal_i64(const std::uint8_t* p, std::size_t n, std::int64_t& out);
std::string format_decimal_i64(std::int64_t v);

}  // namespace pstar::distributed::wire
