// GlooStore: Gloo's rendezvous::Store interface over the libuv store's
// client (store_client.h), so that a Gloo communicator rendezvous through
// the StoreServer on rank 0 (gloo_communicator.h).
//
// Gloo calls set/get/wait from the thread that connects the mesh; errors of
// the client (PSTAR_ERR_COMM: unreachable, timed out) propagate as
// pstar::Error, which the communicator turns into its own failure.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dist/store/store_client.h"

namespace pstar::dist {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  // `timeout` bounds get() and wait() without a timeout of their own.
  GlooStore(std::shared_ptr<StoreClient> client, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<StoreClient> client_;
  std::chrono::milliseconds timeout_;
};

}  // namespace pstar::dist
