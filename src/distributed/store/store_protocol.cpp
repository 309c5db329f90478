#include "distributed/store/store_protocol.h"

#include <limits>

namespace pstar::distributed::wire {

const char* op_name(Op op) {
  switch (op) {
    case Op::kSet: return "set";
    case Op::kGet: return "get";
    case Op::kAdd: return "add";
    case Op::kWait: return "wait";
    case Op::kCheck: return "check";
    case Op::kDelete: return "delete";
    case Op::kNumKeys: return "num_keys";
  }
  return "unknown";
}

bool is_known_op(std::uint8_t op) {
  return op >= static_cast<std::uint8_t>(Op::kSet) && op <= static_cast<std::uint8_t>(Op::kNumKeys);
}

std::vector<std::uint8_t> encode_hello(std::uint32_t magic, std::uint32_t version) {
  std::vector<std::uint8_t> hello(kHelloBytes);
  store_u32(hello.data(), magic);
  store_u32(hello.data() + 4, version);
  return hello;
}

std::size_t request_body_bytes(const std::vector<std::string>& keys, std::size_t value_bytes) {
  std::size_t n = kRequestFixedBytes + value_bytes;
  for (const std::string& k : keys) n += 4 + k.size();
  return n;
}

std::vector<std::uint8_t> encode_request_head(Op op, const std::vector<std::string>& keys, std::size_t value_bytes) {
  const std::size_t body = request_body_bytes(keys, value_bytes);
  std::vector<std::uint8_t> head(kLengthPrefixBytes + body - value_bytes);
  std::uint8_t* p = head.data();
  store_u32(p, static_cast<std::uint32_t>(body));
  p += 4;
  p[0] = static_cast<std::uint8_t>(op);
  p[1] = p[2] = p[3] = 0;
  p += 4;
  store_u32(p, static_cast<std::uint32_t>(keys.size()));
  p += 4;
  for (const std::string& k : keys) {
    store_u32(p, static_cast<std::uint32_t>(k.size()));
    p += 4;
    for (char c : k) *p++ = static_cast<std::uint8_t>(c);
  }
  store_u32(p, static_cast<std::uint32_t>(value_bytes));
  return head;
}

std::string request_shape_error(Op op, std::size_t key_count, std::size_t value_bytes) {
  switch (op) {
    case Op::kSet:
      if (key_count != 1) return "set takes exactly 1 key";
      return {};
    case Op::kGet:
    case Op::kDelete:
      if (key_count != 1) return std::string(op_name(op)) + " takes exactly 1 key";
      if (value_bytes != 0) return std::string(op_name(op)) + " takes no value";
      return {};
    case Op::kAdd:
      if (key_count != 1) return "add takes exactly 1 key";
      if (value_bytes != 8) return "add takes an 8-byte value";
      return {};
    case Op::kWait:
    case Op::kCheck:
      if (key_count == 0) return std::string(op_name(op)) + " takes at least 1 key";
      if (value_bytes != 0) return std::string(op_name(op)) + " takes no value";
      return {};
    case Op::kNumKeys:
      if (key_count != 0 || value_bytes != 0) return "num_keys takes no key and no value";
      return {};
  }
  return "unknown op";
}

std::string parse_request(const std::uint8_t* body, std::size_t body_bytes, Request& out) {
  // Every length is checked against what is left before it is used, so a
  // hostile frame can neither read past the body nor make us allocate more
  // than the body it already sent.
  std::size_t left = body_bytes;
  const std::uint8_t* p = body;
  if (left < kRequestFixedBytes)
    return "body of " + std::to_string(body_bytes) + " bytes is shorter than the fixed fields";
  if (!is_known_op(p[0])) return "unknown op " + std::to_string(p[0]);
  if (p[1] != 0 || p[2] != 0 || p[3] != 0) return "reserved bytes are not zero";
  out.op = static_cast<Op>(p[0]);
  const std::uint32_t key_count = load_u32(p + 4);
  p += 8;
  left -= 8;
  // Each key costs at least its 4-byte length; the value length needs 4 more.
  if (key_count > (left - 4) / 4) return "key_count " + std::to_string(key_count) + " does not fit in the frame";
  out.keys.clear();
  out.keys.reserve(key_count);
  for (std::uint32_t i = 0; i < key_count; ++i) {
    if (left < 4) return "frame ends inside key " + std::to_string(i);
    const std::uint32_t key_bytes = load_u32(p);
    p += 4;
    left -= 4;
    if (key_bytes > kMaxKeyBytes) {
      return "key " + std::to_string(i) + " of " + std::to_string(key_bytes) + " bytes exceeds the limit of " +
             std::to_string(kMaxKeyBytes);
    }
    if (key_bytes > left) return "frame ends inside key " + std::to_string(i);
    out.keys.emplace_back(reinterpret_cast<const char*>(p), key_bytes);
    p += key_bytes;
    left -= key_bytes;
  }
  if (left < 4) return "frame ends before value_bytes";
  const std::uint32_t value_bytes = load_u32(p);
  p += 4;
  left -= 4;
  if (value_bytes > kMaxValueBytes) {
    return "value of " + std::to_string(value_bytes) + " bytes exceeds the limit of " + std::to_string(kMaxValueBytes);
  }
  if (value_bytes != left) {
    return "value_bytes " + std::to_string(value_bytes) + " disagrees with the " + std::to_string(left) +
           " bytes left in the frame";
  }
  out.value = p;
  out.value_bytes = value_bytes;
  return request_shape_error(out.op, out.keys.size(), out.value_bytes);
}

bool parse_decimal_i64(const std::uint8_t* p, std::size_t n, std::int64_t& out) {
  std::size_t i = 0;
  const bool negative = n > 0 && p[0] == '-';
  if (negative) i = 1;
  if (i == n) return false;
  // Accumulate as a negative number: its range includes INT64_MIN.
  std::int64_t v = 0;
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  for (; i < n; ++i) {
    if (p[i] < '0' || p[i] > '9') return false;
    const int digit = p[i] - '0';
    if (v < (kMin + digit) / 10) return false;
    v = v * 10 - digit;
  }
  if (!negative) {
    if (v == kMin) return false;
    v = -v;
  }
  out = v;
  return true;
}

std::string format_decimal_i64(std::int64_t v) { return std::to_string(v); }

}  // namespace pstar::distributed::wire
