#include "distributed/store/gloo_store.h"

namespace pstar::distributed {

GlooStore::GlooStore(std::shared_ptr<pstar::distributed::Store> client, std::chrono::milliseconds timeout)
    : client_(std::move(client)), timeout_(timeout) {}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  client_->set(key, data.data(), data.size());
}

std::vector<char> GlooStore::get(const std::string& key) {
  const pstar::distributed::Store::Bytes v = client_->get(key, timeout_);
  return std::vector<char>(v.begin(), v.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { client_->wait(keys, timeout_); }

void GlooStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // Gloo passes its context's timeout; a non-positive one means "ours".
  client_->wait(keys, timeout.count() > 0 ? timeout : timeout_);
}

}  // namespace pstar::distributed
