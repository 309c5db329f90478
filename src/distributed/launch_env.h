// Where this process sits in a data-parallel job: its rank, the world size,
// its place on its node and the rendezvous address (the store's server on
// rank 0).  Resolved from values the caller gives explicitly, else from the
// environment a launcher left (torchrun-style, Open MPI's mpirun, Slurm's
// srun), else a single process.  docs/launching.md describes the rules for
// users; every malformed or inconsistent value is an error naming the
// variable and its value, never silently replaced by a default.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace pstar::distributed {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank among the processes on this node
  int local_world_size = 1;  // processes on this node
  std::string master_addr;   // host of rank 0's store server
  uint16_t master_port = 0;  // 0 only for a single process given no port
  // Where rank and world size came from: "explicit", "torchrun", "openmpi",
  // "slurm" or "single".
  std::string source;
  // Who serves the rendezvous store at master_addr:master_port.  false:
  // nobody yet; rank 0 starts libpstar's own store server there (pstar-run,
  // mpirun, srun, explicit values).  true: torchrun's agent already serves
  // a c10d TCPStore there (TORCHELASTIC_USE_AGENT_STORE=True, the address
  // taken from MASTER_ADDR/MASTER_PORT); every rank joins it as a client.
  bool torch_agent_store = false;
  // The namespace of libpstar's keys in torchrun's store:
  // "libpstar/attempt_<TORCHELASTIC_RESTART_COUNT>/" (a restarted attempt
  // never reads its predecessor's keys; torch.distributed's own keys live
  // under "/worker/attempt_<N>/"); empty otherwise.
  std::string store_key_prefix;
};

// Values the caller sets itself; a negative number (an empty address) means
// "not given".  rank and world_size go together: giving one without the
// other is an error; so do local_rank and local_world_size.
struct LaunchRequest {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  int local_world_size = -1;
  std::string master_addr;
  int master_port = -1;  // 1..65535 when given
};

// Looks up one environment variable: the value, or nullopt when unset (a
// variable set to the empty string is set, and then invalid wherever a
// value is needed).
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The real process environment (std::getenv).
EnvLookup process_environment();

// Resolves the launch information.  Precedence:
//  1. rank and world_size given in `request`: source "explicit";
//  2. else the first launcher whose variables are present in `env`:
//     RANK/WORLD_SIZE (torchrun and anything that mimics it), then
//     OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE, then SLURM_PROCID/
//     SLURM_NTASKS;
//  3. else a single process (rank 0 of 1).
// Each field the request gives wins over the environment.  The master
// address and port come from the request, else MASTER_ADDR/MASTER_PORT (for
// every source: mpirun and srun set no rendezvous address), else, for a
// single process only, 127.0.0.1 and port 0.  Local rank and size come from
// the request, else the launcher's variables (never read for an explicit
// source), else the whole world is taken to be one node.
// torchrun's agent store is joined (torch_agent_store) when the source is
// torchrun, TORCHELASTIC_USE_AGENT_STORE is "True" and neither the master
// address nor the port was given explicitly; TORCHELASTIC_USE_AGENT_STORE
// must be "True" or "False" when set, TORCHELASTIC_RESTART_COUNT a
// non-negative integer.
// Throws pstar::Error(PSTAR_ERR_INVALID_ARGUMENT) naming the variable and
// its value on anything malformed or inconsistent.
LaunchInfo resolve_launch(const LaunchRequest& request, const EnvLookup& env);

// resolve_launch(request, process_environment()).
LaunchInfo resolve_launch(const LaunchRequest& request = {});

// One line for logs: "rank 1 of 4 (local 1 of 4) via torchrun, master
// 127.0.0.1:29500".
std::string describe(const LaunchInfo& info);

}  // namespace pstar::distributed
