// GlooStore: Gloo's rendezvous::Store interface over a rendezvous store
// client (store.h: libpstar's StoreServer on rank 0, or torchrun's TCPStore),
// so that a Gloo communicator meets its peers there (gloo_communicator.h).
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

#include "distributed/store/store.h"

namespace pstar::distributed {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  // `timeout` bounds get() and wait() without a timeout of their own.
  GlooStore(std::shared_ptr<pstar::distributed::Store> client, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<pstar::distributed::Store> client_;
  std::chrono::milliseconds timeout_;
};

}  // namespace pstar::distributed
