#include "distributed/launch_env.h"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <system_error>
#include <utility>
#include <vector>

#include "util/error.h"

namespace pstar::distributed {
namespace {

[[noreturn]] void invalid(const std::string& message) { throw Error(PSTAR_ERR_INVALID_ARGUMENT, message); }

std::string show(const std::string& name, const std::string& value) { return name + "='" + value + "'"; }

// A whole decimal integer that fits an int: no sign other than '-', no
// blanks, nothing after the digits.
int parse_int(const std::string& name, const std::string& value) {
  int out = 0;
  const char* first = value.data();
  const char* last = first + value.size();
  const auto [ptr, ec] = std::from_chars(first, last, out);
  if (value.empty() || ec == std::errc::invalid_argument || ptr != last)
    invalid(show(name, value) + " is not a decimal integer");
  if (ec == std::errc::result_out_of_range) invalid(show(name, value) + " is out of range");
  return out;
}

// A variable of the environment: its name and, when set, its value.
struct Var {
  std::string name;
  std::optional<std::string> value;
  bool set() const { return value.has_value(); }
  int as_int() const { return parse_int(name, *value); }
};

Var lookup(const EnvLookup& env, const std::string& name) { return Var{name, env(name)}; }

// An integer with the name it is reported under ("RANK" or "rank").
struct Named {
  std::string name;
  int value;
};

void check_world(const Named& world) {
  if (world.value < 1) invalid(world.name + "=" + std::to_string(world.value) + " must be at least 1");
}

void check_rank(const Named& rank, const Named& world) {
  if (rank.value < 0 || rank.value >= world.value)
    invalid(rank.name + "=" + std::to_string(rank.value) + " is out of range for " + world.name + "=" +
            std::to_string(world.value) + " (0 <= " + rank.name + " < " + world.name + ")");
}

void check_local(const Named& local_rank, const Named& local_world, const Named& world) {
  if (local_world.value < 1 || local_world.value > world.value)
    invalid(local_world.name + "=" + std::to_string(local_world.value) + " is out of range for " + world.name + "=" +
            std::to_string(world.value) + " (1 <= " + local_world.name + " <= " + world.name + ")");
  check_rank(local_rank, local_world);
}

// Rank and size read from one launcher's variables.
struct Found {
  std::string source;
  Named rank, world;
  std::optional<Named> local_rank, local_world;
  // What to tell a user whose launcher gives no rendezvous address.
  std::string master_hint;
};

// A pair that must be given together ("RANK" and "WORLD_SIZE").
void require_pair(const Var& a, const Var& b, const std::string& what) {
  if (a.set() && !b.set())
    invalid(show(a.name, *a.value) + " is set but " + b.name + " is not (" + what + " needs both)");
  if (b.set() && !a.set())
    invalid(show(b.name, *b.value) + " is set but " + a.name + " is not (" + what + " needs both)");
}

// Reads a launcher's rank/size pair and its optional local pair; nullopt
// when none of its rank/size variables is set.
std::optional<Found> read_launcher(const EnvLookup& env, const std::string& source, const std::string& rank_name,
                                   const std::string& world_name, const std::string& local_rank_name,
                                   const std::string& local_world_name, const std::string& hint) {
  const Var rank = lookup(env, rank_name), world = lookup(env, world_name);
  const Var local_rank = lookup(env, local_rank_name), local_world = lookup(env, local_world_name);
  if (!rank.set() && !world.set()) {
    if (local_rank.set() || local_world.set()) {
      const Var& v = local_rank.set() ? local_rank : local_world;
      invalid(show(v.name, *v.value) + " is set but " + rank_name + " and " + world_name + " are not (" + source +
              " environment)");
    }
    return std::nullopt;
  }
  require_pair(rank, world, source + " environment");
  Found f{source, {rank_name, rank.as_int()}, {world_name, world.as_int()}, {}, {}, hint};
  require_pair(local_rank, local_world, source + " environment");
  if (local_rank.set()) {
    f.local_rank = Named{local_rank_name, local_rank.as_int()};
    f.local_world = Named{local_world_name, local_world.as_int()};
  }
  return f;
}

// Slurm gives the tasks on this node as SLURM_NTASKS_PER_NODE only when the
// job asked for --ntasks-per-node; otherwise SLURM_TASKS_PER_NODE lists
// counts per node ("2(x3),1") and SLURM_NODEID says which is ours.
Named slurm_tasks_on_this_node(const EnvLookup& env, const Var& local_id) {
  const Var per_node = lookup(env, "SLURM_NTASKS_PER_NODE");
  if (per_node.set()) return Named{per_node.name, per_node.as_int()};
  const Var list = lookup(env, "SLURM_TASKS_PER_NODE");
  const Var node = lookup(env, "SLURM_NODEID");
  if (!list.set() || !node.set())
    invalid(show(local_id.name, *local_id.value) +
            " is set but neither SLURM_NTASKS_PER_NODE nor SLURM_TASKS_PER_NODE with SLURM_NODEID "
            "is (Slurm environment)");
  const int node_id = node.as_int();
  if (node_id < 0) invalid(show(node.name, *node.value) + " is negative");
  const std::string& s = *list.value;
  const auto bad = [&]() { invalid(show(list.name, s) + " is not a list such as 2(x3),1"); };
  long seen = 0;  // nodes covered so far
  size_t i = 0;
  while (true) {
    size_t j = i;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
    if (j == i) bad();
    const int count = parse_int(list.name, s.substr(i, j - i));
    int repeat = 1;
    if (j < s.size() && s[j] == '(') {
      if (j + 1 >= s.size() || s[j + 1] != 'x') bad();
      size_t k = j + 2, m = k;
      while (m < s.size() && std::isdigit(static_cast<unsigned char>(s[m]))) ++m;
      if (m == k || m >= s.size() || s[m] != ')') bad();
      repeat = parse_int(list.name, s.substr(k, m - k));
      if (repeat < 1) bad();
      j = m + 1;
    }
    if (node_id < seen + repeat) return Named{list.name + " (node " + *node.value + ")", count};
    seen += repeat;
    if (j == s.size()) break;
    if (s[j] != ',') bad();
    i = j + 1;
  }
  invalid(show(node.name, *node.value) + " is beyond the " + std::to_string(seen) + " nodes of " + show(list.name, s));
}

std::optional<Found> read_slurm(const EnvLookup& env, const std::string& hint) {
  const Var rank = lookup(env, "SLURM_PROCID"), world = lookup(env, "SLURM_NTASKS");
  if (!rank.set()) return std::nullopt;  // SLURM_NTASKS alone: an allocation, not a task
  if (!world.set()) invalid(show(rank.name, *rank.value) + " is set but SLURM_NTASKS is not (Slurm environment)");
  Found f{"slurm", {rank.name, rank.as_int()}, {world.name, world.as_int()}, {}, {}, hint};
  const Var local_rank = lookup(env, "SLURM_LOCALID");
  if (local_rank.set()) {
    f.local_rank = Named{local_rank.name, local_rank.as_int()};
    f.local_world = slurm_tasks_on_this_node(env, local_rank);
  }
  return f;
}

bool has_blank(const std::string& s) {
  for (unsigned char c : s)
    if (std::isspace(c) || std::iscntrl(c)) return true;
  return false;
}

}  // namespace

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

LaunchInfo resolve_launch(const LaunchRequest& request, const EnvLookup& env) {
  // 1. Rank and world size: explicit, else the first launcher found.
  std::optional<Found> found;
  if (request.rank >= 0 || request.world_size >= 0) {
    if (request.rank < 0)
      invalid("world_size=" + std::to_string(request.world_size) + " given explicitly without rank");
    if (request.world_size < 0)
      invalid("rank=" + std::to_string(request.rank) + " given explicitly without world_size");
    found = Found{"explicit",
                  {"rank", request.rank},
                  {"world_size", request.world_size},
                  {},
                  {},
                  "set the master address and port explicitly or export MASTER_ADDR and MASTER_PORT"};
  }
  if (!found)
    found = read_launcher(env, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                          "the launcher must export MASTER_ADDR and MASTER_PORT (torchrun does)");
  if (!found)
    found = read_launcher(env, "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE",
                          "mpirun sets no rendezvous address: export MASTER_ADDR and MASTER_PORT "
                          "to every rank (mpirun -x MASTER_ADDR -x MASTER_PORT)");
  if (!found)
    found = read_slurm(env,
                       "srun sets no rendezvous address: export MASTER_ADDR (the first host of "
                       "the job) and MASTER_PORT before srun");
  if (!found) found = Found{"single", {"rank", 0}, {"world_size", 1}, {}, {}, ""};
  const Found& f = *found;
  check_world(f.world);
  check_rank(f.rank, f.world);

  LaunchInfo info;
  info.source = f.source;
  info.rank = f.rank.value;
  info.world_size = f.world.value;

  // 2. Local rank and size: explicit, else the launcher's, else one node.
  if (request.local_rank >= 0 || request.local_world_size >= 0) {
    if (request.local_rank < 0)
      invalid("local_world_size=" + std::to_string(request.local_world_size) + " given explicitly without local_rank");
    if (request.local_world_size < 0)
      invalid("local_rank=" + std::to_string(request.local_rank) + " given explicitly without local_world_size");
    check_local({"local_rank", request.local_rank}, {"local_world_size", request.local_world_size}, f.world);
    info.local_rank = request.local_rank;
    info.local_world_size = request.local_world_size;
  } else if (f.local_rank) {
    check_local(*f.local_rank, *f.local_world, f.world);
    info.local_rank = f.local_rank->value;
    info.local_world_size = f.local_world->value;
  } else {
    info.local_rank = info.rank;
    info.local_world_size = info.world_size;
  }

  // 3. The rendezvous address: explicit, else MASTER_ADDR/MASTER_PORT, else
  // (one process only) loopback without a port.
  const auto missing = [&](const std::string& what) {
    invalid(f.world.name + "=" + std::to_string(f.world.value) + " (" + f.source + ") but " + what +
            " is not set: " + f.master_hint);
  };
  if (!request.master_addr.empty()) {
    if (has_blank(request.master_addr))
      invalid("master_addr='" + request.master_addr + "' given explicitly contains a blank");
    info.master_addr = request.master_addr;
  } else if (const Var addr = lookup(env, "MASTER_ADDR"); addr.set()) {
    if (addr.value->empty()) invalid("MASTER_ADDR is set but empty");
    if (has_blank(*addr.value)) invalid(show(addr.name, *addr.value) + " contains a blank");
    info.master_addr = *addr.value;
  } else if (info.world_size == 1) {
    info.master_addr = "127.0.0.1";
  } else {
    missing("MASTER_ADDR");
  }

  if (request.master_port >= 0) {
    if (request.master_port < 1 || request.master_port > 65535)
      invalid("master_port=" + std::to_string(request.master_port) + " given explicitly is out of range 1..65535");
    info.master_port = static_cast<uint16_t>(request.master_port);
  } else if (const Var port = lookup(env, "MASTER_PORT"); port.set()) {
    const int p = port.as_int();
    if (p < 1 || p > 65535) invalid(show(port.name, *port.value) + " is out of range 1..65535");
    info.master_port = static_cast<uint16_t>(p);
  } else if (info.world_size == 1) {
    info.master_port = 0;
  } else {
    missing("MASTER_PORT");
  }

  // 4. Who serves the store: torchrun's agent, or rank 0.
  if (f.source == "torchrun" && request.master_addr.empty() && request.master_port < 0) {
    if (const Var agent = lookup(env, "TORCHELASTIC_USE_AGENT_STORE"); agent.set()) {
      if (*agent.value != "True" && *agent.value != "False")
        invalid(show(agent.name, *agent.value) + " is neither 'True' nor 'False'");
      info.torch_agent_store = *agent.value == "True";
    }
    if (info.torch_agent_store) {
      int attempt = 0;
      if (const Var restarts = lookup(env, "TORCHELASTIC_RESTART_COUNT"); restarts.set()) {
        attempt = restarts.as_int();
        if (attempt < 0) invalid(show(restarts.name, *restarts.value) + " is negative");
      }
      info.store_key_prefix = "libpstar/attempt_" + std::to_string(attempt) + "/";
    }
  }
  return info;
}

LaunchInfo resolve_launch(const LaunchRequest& request) { return resolve_launch(request, process_environment()); }

std::string describe(const LaunchInfo& info) {
  return "rank " + std::to_string(info.rank) + " of " + std::to_string(info.world_size) + " (local " +
         std::to_string(info.local_rank) + " of " + std::to_string(info.local_world_size) + ") via " + info.source +
         ", master " + info.master_addr + ":" + std::to_string(info.master_port) +
         (info.torch_agent_store ? " (torchrun's store)" : "");
}

}  // namespace pstar::distributed
