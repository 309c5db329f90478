#include "distributed/store/store.h"

#include "distributed/store/store_client.h"
#include "distributed/store/tcpstore_client.h"

namespace pstar::distributed {

const char* store_protocol_name(StoreProtocol protocol) {
  switch (protocol) {
    case StoreProtocol::kLibpstar: return "libpstar";
    case StoreProtocol::kTcpStore: return "c10d TCPStore";
  }
  return "?";
}

std::unique_ptr<Store> connect_store(const StoreClientOptions& options) {
  if (options.protocol == StoreProtocol::kTcpStore) return std::make_unique<TcpStoreClient>(options);
  return std::make_unique<StoreClient>(options);
}

}  // namespace pstar::distributed
