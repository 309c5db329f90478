// The build's layout agreement (src/distributed/layout_agreement.h) over a
// scripted communicator standing for rank 1 of 2, whose peer (rank 0)
// answers what the test scripts: the same layout passes; another order of
// the same parameters, or another setting, is a different hash; a peer
// with other parameters fails with both ranks' counts; a rank without
// room for the gather-ahead slots fails every rank, named.
#include <criterion/criterion.h>

#include <cstring>
#include <memory>
#include <string>

#include "distributed/layout_agreement.h"
#include "fakes.h"
#include "util/error.h"

using pstar::Error;
using pstar::distributed::LayoutHash;
using pstar::distributed::ProcessGroup;
using pstar::distributed::SlotNeed;

namespace {

LayoutHash model(bool swapped, uint64_t chunk_elems = 4096) {
  LayoutHash h;
  h.add(chunk_elems);
  const std::string a = "fc1.weight", b = "fc1.bias";
  if (swapped) {
    h.add_param(b, {64}, 0, 64);
    h.add_param(a, {64, 32}, 0, 2048);
  } else {
    h.add_param(a, {64, 32}, 0, 2048);
    h.add_param(b, {64}, 0, 64);
  }
  return h;
}

// The peer's four words: hash, parameters, elements, slots fit.
std::unique_ptr<ProcessGroup> peer_says(const LayoutHash& peer, bool peer_fits) {
  auto c = std::make_unique<pstar::testing::ScriptedComm>(1, 2);
  c->on_all_gather = [=](const void* mine, void* out, size_t bytes) {
    auto* all = static_cast<uint64_t*>(out);
    std::memcpy(all + 4, mine, bytes);
    all[0] = peer.hash();
    all[1] = peer.params();
    all[2] = peer.elements();
    all[3] = peer_fits ? 1 : 0;
  };
  auto g = std::make_unique<ProcessGroup>();
  g->adopt(std::move(c));
  return g;
}

pstar_status check(ProcessGroup& g, const LayoutHash& mine, const SlotNeed& slots, std::string* msg) {
  try {
    pstar::distributed::check_layout_agrees(g, mine, slots);
  } catch (const Error& e) {
    *msg = e.what();
    return e.status();
  }
  return PSTAR_OK;
}

}  // namespace

Test(layout_agreement, the_hash_follows_order_and_settings) {
  cr_assert_eq(model(false).hash(), model(false).hash());
  cr_assert_neq(model(false).hash(), model(true).hash());
  cr_assert_neq(model(false).hash(), model(false, 8192).hash());
  cr_assert_eq(model(true).params(), 2u);
  cr_assert_eq(model(true).elements(), 2112u);
}

Test(layout_agreement, the_same_layout_passes) {
  auto g = peer_says(model(false), true);
  std::string msg;
  cr_assert_eq(check(*g, model(false), SlotNeed{}, &msg), PSTAR_OK, "%s", msg.c_str());
  cr_assert_eq(g->collectives(), 1u);
}

Test(layout_agreement, other_parameters_fail_with_both_counts) {
  LayoutHash fewer;
  fewer.add(4096);
  fewer.add_param("fc1.weight", {64, 32}, 0, 2048);
  auto g = peer_says(fewer, true);  // rank 0 registered one parameter
  std::string msg;
  cr_assert_eq(check(*g, model(false), SlotNeed{}, &msg), PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert(msg.find("rank 0 registered 1 parameters of 2048 elements, rank 1 2 of 2112") != std::string::npos, "%s",
            msg.c_str());
  auto h = peer_says(model(true), true);  // the same counts, another order
  cr_assert_eq(check(*h, model(false), SlotNeed{}, &msg), PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert(msg.find("but with other names, shapes, flags or order") != std::string::npos, "%s", msg.c_str());
}

Test(layout_agreement, a_rank_short_of_slot_room_fails_every_rank) {
  auto g = peer_says(model(false), false);
  SlotNeed slots;
  slots.depth = 2;
  slots.slot_bytes = 8192;
  std::string msg;
  cr_assert_eq(check(*g, model(false), slots, &msg), PSTAR_ERR_OUT_OF_MEMORY);  // this rank fits; rank 0 does not
  cr_assert(msg.find("2 device slots of 8192 bytes") != std::string::npos, "%s", msg.c_str());
  cr_assert(msg.find("rank(s) 0;") != std::string::npos, "%s", msg.c_str());
}
