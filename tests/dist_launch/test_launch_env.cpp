// Resolution of the launch information: each launcher's variables, the
// precedence between sources, explicit values winning, and every validation
// error (status and a message naming the variable and its value).  The
// environment is a map handed in as the lookup: nothing here touches the
// process environment except one read-only check of process_environment().
#include <criterion/criterion.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "distributed/launch_env.h"
#include "util/error.h"

using pstar::distributed::EnvLookup;
using pstar::distributed::LaunchInfo;
using pstar::distributed::LaunchRequest;
using pstar::distributed::resolve_launch;

namespace {

using Env = std::map<std::string, std::string>;

EnvLookup lookup_in(const Env& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    const auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

LaunchInfo resolve(const Env& env, const LaunchRequest& request = {}) {
  return resolve_launch(request, lookup_in(env));
}

void expect_info(const LaunchInfo& i, int rank, int world, int local_rank, int local_world,
                 const char* addr, int port, const char* source) {
  cr_expect_eq(i.rank, rank, "rank %d, expected %d", i.rank, rank);
  cr_expect_eq(i.world_size, world, "world_size %d, expected %d", i.world_size, world);
  cr_expect_eq(i.local_rank, local_rank, "local_rank %d, expected %d", i.local_rank, local_rank);
  cr_expect_eq(i.local_world_size, local_world, "local_world_size %d, expected %d",
               i.local_world_size, local_world);
  cr_expect_eq(i.master_addr, std::string(addr), "master_addr '%s', expected '%s'",
               i.master_addr.c_str(), addr);
  cr_expect_eq(i.master_port, port, "master_port %d, expected %d", i.master_port, port);
  cr_expect_eq(i.source, std::string(source), "source '%s', expected '%s'", i.source.c_str(),
               source);
}

// Resolving must throw INVALID_ARGUMENT with every one of `needles` in the
// message.
void expect_error(const char* what, const Env& env, const LaunchRequest& request,
                  const std::vector<std::string>& needles) {
  try {
    const LaunchInfo i = resolve(env, request);
    cr_expect_fail("%s: resolved to rank %d of %d instead of failing", what, i.rank, i.world_size);
  } catch (const pstar::Error& e) {
    cr_expect_eq(e.status(), PSTAR_ERR_INVALID_ARGUMENT, "%s: status %d", what, e.status());
    for (const auto& n : needles)
      cr_expect(std::string(e.what()).find(n) != std::string::npos,
                "%s: message \"%s\" lacks \"%s\"", what, e.what(), n.c_str());
  }
}

void expect_error(const char* what, const Env& env, const std::vector<std::string>& needles) {
  expect_error(what, env, LaunchRequest{}, needles);
}

const Env kTorchrun = {{"RANK", "3"},
                       {"WORLD_SIZE", "8"},
                       {"LOCAL_RANK", "1"},
                       {"LOCAL_WORLD_SIZE", "2"},
                       {"MASTER_ADDR", "node0"},
                       {"MASTER_PORT", "29500"}};
const Env kOpenMpi = {{"OMPI_COMM_WORLD_RANK", "5"},       {"OMPI_COMM_WORLD_SIZE", "6"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                      {"MASTER_ADDR", "10.0.0.1"},         {"MASTER_PORT", "1234"}};
const Env kSlurm = {{"SLURM_PROCID", "6"},      {"SLURM_NTASKS", "8"},
                    {"SLURM_LOCALID", "2"},     {"SLURM_NTASKS_PER_NODE", "4"},
                    {"MASTER_ADDR", "gpu-a17"}, {"MASTER_PORT", "65535"}};

Env merged(std::initializer_list<Env> envs) {
  Env out;
  for (const Env& e : envs)
    for (const auto& [k, v] : e) out[k] = v;
  return out;
}

Env without(Env env, std::initializer_list<const char*> names) {
  for (const char* n : names) env.erase(n);
  return env;
}

Env with(Env env, std::initializer_list<std::pair<const char*, const char*>> values) {
  for (const auto& [k, v] : values) env[k] = v;
  return env;
}

}  // namespace

// ---- each source -------------------------------------------------------------

Test(launch_env, nothing_set_is_a_single_process) {
  expect_info(resolve({}), 0, 1, 0, 1, "127.0.0.1", 0, "single");
}

Test(launch_env, single_process_takes_master_address_and_port_from_the_environment) {
  expect_info(resolve({{"MASTER_ADDR", "::1"}, {"MASTER_PORT", "4000"}}), 0, 1, 0, 1, "::1", 4000,
              "single");
}

Test(launch_env, torchrun_variables) {
  expect_info(resolve(kTorchrun), 3, 8, 1, 2, "node0", 29500, "torchrun");
}

Test(launch_env, torchrun_without_local_variables_is_one_node) {
  expect_info(resolve(without(kTorchrun, {"LOCAL_RANK", "LOCAL_WORLD_SIZE"})), 3, 8, 3, 8, "node0",
              29500, "torchrun");
}

Test(launch_env, open_mpi_variables) {
  expect_info(resolve(kOpenMpi), 5, 6, 2, 3, "10.0.0.1", 1234, "openmpi");
}

Test(launch_env, slurm_variables_with_ntasks_per_node) {
  expect_info(resolve(kSlurm), 6, 8, 2, 4, "gpu-a17", 65535, "slurm");
}

Test(launch_env, slurm_tasks_per_node_list_and_node_id) {
  const Env base = with(without(kSlurm, {"SLURM_NTASKS_PER_NODE"}),
                        {{"SLURM_NTASKS", "7"}, {"SLURM_TASKS_PER_NODE", "2(x3),1"}});
  // Nodes 0-2 run 2 tasks each, node 3 one.
  expect_info(
      resolve(with(base, {{"SLURM_NODEID", "1"}, {"SLURM_PROCID", "3"}, {"SLURM_LOCALID", "1"}})),
      3, 7, 1, 2, "gpu-a17", 65535, "slurm");
  expect_info(
      resolve(with(base, {{"SLURM_NODEID", "3"}, {"SLURM_PROCID", "6"}, {"SLURM_LOCALID", "0"}})),
      6, 7, 0, 1, "gpu-a17", 65535, "slurm");
  expect_info(resolve(with(base, {{"SLURM_TASKS_PER_NODE", "4"},
                                  {"SLURM_NODEID", "0"},
                                  {"SLURM_PROCID", "2"},
                                  {"SLURM_LOCALID", "2"}})),
              2, 7, 2, 4, "gpu-a17", 65535, "slurm");
}

Test(launch_env, slurm_allocation_without_a_task_is_a_single_process) {
  // salloc/sbatch export SLURM_NTASKS; only a task started by srun has
  // SLURM_PROCID.
  expect_info(resolve({{"SLURM_NTASKS", "4"}}), 0, 1, 0, 1, "127.0.0.1", 0, "single");
}

Test(launch_env, one_rank_launchers_need_no_master) {
  expect_info(resolve({{"RANK", "0"}, {"WORLD_SIZE", "1"}}), 0, 1, 0, 1, "127.0.0.1", 0,
              "torchrun");
  expect_info(resolve({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}}), 0, 1, 0, 1,
              "127.0.0.1", 0, "openmpi");
}

Test(launch_env, port_bounds_are_accepted) {
  expect_info(resolve(with(kTorchrun, {{"MASTER_PORT", "1"}})), 3, 8, 1, 2, "node0", 1, "torchrun");
  expect_info(resolve(with(kTorchrun, {{"MASTER_PORT", "65535"}})), 3, 8, 1, 2, "node0", 65535,
              "torchrun");
}

// ---- precedence ----------------------------------------------------------------

Test(launch_env, torchrun_before_open_mpi_before_slurm) {
  // One MASTER_ADDR/MASTER_PORT for all: the last merged wins in the map.
  const Env all = merged({kSlurm, kOpenMpi, kTorchrun});
  expect_info(resolve(all), 3, 8, 1, 2, "node0", 29500, "torchrun");
  const Env mpi_slurm = merged({kSlurm, kOpenMpi});
  expect_info(resolve(mpi_slurm), 5, 6, 2, 3, "10.0.0.1", 1234, "openmpi");
}

Test(launch_env, explicit_rank_and_world_win_over_the_environment) {
  LaunchRequest r;
  r.rank = 1;
  r.world_size = 2;
  // Local values are not taken from a launcher the caller overrode.
  expect_info(resolve(kTorchrun, r), 1, 2, 1, 2, "node0", 29500, "explicit");
  expect_info(resolve(kOpenMpi, r), 1, 2, 1, 2, "10.0.0.1", 1234, "explicit");
}

Test(launch_env, explicit_fields_win_one_by_one) {
  LaunchRequest r;
  r.local_rank = 0;
  r.local_world_size = 4;
  r.master_addr = "head";
  r.master_port = 777;
  expect_info(resolve(kTorchrun, r), 3, 8, 0, 4, "head", 777, "torchrun");
  r.rank = 5;
  r.world_size = 6;
  expect_info(resolve(kSlurm, r), 5, 6, 0, 4, "head", 777, "explicit");
}

Test(launch_env, explicit_values_need_no_environment) {
  LaunchRequest r;
  r.rank = 0;
  r.world_size = 1;
  expect_info(resolve({}, r), 0, 1, 0, 1, "127.0.0.1", 0, "explicit");
  r.rank = 2;
  r.world_size = 4;
  r.master_addr = "127.0.0.1";
  r.master_port = 5000;
  expect_info(resolve({}, r), 2, 4, 2, 4, "127.0.0.1", 5000, "explicit");
}

// ---- validation: malformed integers ----------------------------------------

Test(launch_env, integers_must_parse_fully) {
  for (const char* bad : {"abc", "", " 1", "1 ", "1x", "+1", "0x1", "1.0", "99999999999"}) {
    const std::string what = std::string("RANK='") + bad + "'";
    expect_error(what.c_str(), with(kTorchrun, {{"RANK", bad}}), {what});
  }
  expect_error("WORLD_SIZE", with(kTorchrun, {{"WORLD_SIZE", "8a"}}), {"WORLD_SIZE='8a'"});
  expect_error("LOCAL_RANK", with(kTorchrun, {{"LOCAL_RANK", "one"}}), {"LOCAL_RANK='one'"});
  expect_error("LOCAL_WORLD_SIZE", with(kTorchrun, {{"LOCAL_WORLD_SIZE", "-"}}),
               {"LOCAL_WORLD_SIZE='-'"});
  expect_error("MASTER_PORT", with(kTorchrun, {{"MASTER_PORT", "http"}}), {"MASTER_PORT='http'"});
  expect_error("OMPI rank", with(kOpenMpi, {{"OMPI_COMM_WORLD_RANK", "5!"}}),
               {"OMPI_COMM_WORLD_RANK='5!'"});
  expect_error("OMPI size", with(kOpenMpi, {{"OMPI_COMM_WORLD_SIZE", ""}}),
               {"OMPI_COMM_WORLD_SIZE=''"});
  expect_error("OMPI local size", with(kOpenMpi, {{"OMPI_COMM_WORLD_LOCAL_SIZE", "3 "}}),
               {"OMPI_COMM_WORLD_LOCAL_SIZE='3 '"});
  expect_error("SLURM_PROCID", with(kSlurm, {{"SLURM_PROCID", "x"}}), {"SLURM_PROCID='x'"});
  expect_error("SLURM_NTASKS", with(kSlurm, {{"SLURM_NTASKS", "8.0"}}), {"SLURM_NTASKS='8.0'"});
  expect_error("SLURM_LOCALID", with(kSlurm, {{"SLURM_LOCALID", "z"}}), {"SLURM_LOCALID='z'"});
  expect_error("SLURM_NTASKS_PER_NODE", with(kSlurm, {{"SLURM_NTASKS_PER_NODE", "4(x2)"}}),
               {"SLURM_NTASKS_PER_NODE='4(x2)'"});
}

// ---- validation: ranges --------------------------------------------------------

Test(launch_env, rank_must_be_below_world_size) {
  expect_error("rank = world", with(kTorchrun, {{"RANK", "8"}}), {"RANK=8", "WORLD_SIZE=8"});
  expect_error("negative rank", with(kTorchrun, {{"RANK", "-1"}}), {"RANK=-1"});
  expect_error("OMPI rank = size", with(kOpenMpi, {{"OMPI_COMM_WORLD_RANK", "6"}}),
               {"OMPI_COMM_WORLD_RANK=6", "OMPI_COMM_WORLD_SIZE=6"});
  expect_error("SLURM rank = ntasks", with(kSlurm, {{"SLURM_PROCID", "8"}}),
               {"SLURM_PROCID=8", "SLURM_NTASKS=8"});
}

Test(launch_env, world_size_must_be_positive) {
  expect_error("WORLD_SIZE=0", with(kTorchrun, {{"RANK", "0"}, {"WORLD_SIZE", "0"}}),
               {"WORLD_SIZE=0"});
  expect_error("OMPI size -2", with(kOpenMpi, {{"OMPI_COMM_WORLD_SIZE", "-2"}}),
               {"OMPI_COMM_WORLD_SIZE=-2"});
}

Test(launch_env, local_values_must_fit) {
  expect_error("local rank = local size", with(kTorchrun, {{"LOCAL_RANK", "2"}}),
               {"LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"});
  expect_error("local size above world", with(kTorchrun, {{"LOCAL_WORLD_SIZE", "9"}}),
               {"LOCAL_WORLD_SIZE=9", "WORLD_SIZE=8"});
  expect_error("local size 0", with(kTorchrun, {{"LOCAL_WORLD_SIZE", "0"}}),
               {"LOCAL_WORLD_SIZE=0"});
  expect_error("negative local rank", with(kTorchrun, {{"LOCAL_RANK", "-1"}}), {"LOCAL_RANK=-1"});
  expect_error("OMPI local rank", with(kOpenMpi, {{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}}),
               {"OMPI_COMM_WORLD_LOCAL_RANK=3", "OMPI_COMM_WORLD_LOCAL_SIZE=3"});
  expect_error("SLURM local id", with(kSlurm, {{"SLURM_LOCALID", "4"}}),
               {"SLURM_LOCALID=4", "SLURM_NTASKS_PER_NODE=4"});
  expect_error("SLURM per node above ntasks", with(kSlurm, {{"SLURM_NTASKS_PER_NODE", "16"}}),
               {"SLURM_NTASKS_PER_NODE=16", "SLURM_NTASKS=8"});
}

Test(launch_env, port_must_be_in_range) {
  for (const char* bad : {"0", "65536", "-1", "100000"}) {
    const std::string what = std::string("MASTER_PORT='") + bad + "'";
    expect_error(what.c_str(), with(kTorchrun, {{"MASTER_PORT", bad}}), {what});
  }
  expect_error("single process, bad port", {{"MASTER_PORT", "0"}}, {"MASTER_PORT='0'"});
}

Test(launch_env, master_address_must_be_a_host) {
  expect_error("empty", with(kTorchrun, {{"MASTER_ADDR", ""}}), {"MASTER_ADDR", "empty"});
  expect_error("blank", with(kTorchrun, {{"MASTER_ADDR", "node 0"}}), {"MASTER_ADDR='node 0'"});
  expect_error("newline", with(kTorchrun, {{"MASTER_ADDR", "node0\n"}}), {"MASTER_ADDR="});
}

// ---- validation: inconsistent sets -----------------------------------------

Test(launch_env, torchrun_pairs_go_together) {
  expect_error("RANK alone", {{"RANK", "1"}}, {"RANK='1'", "WORLD_SIZE"});
  expect_error("WORLD_SIZE alone", {{"WORLD_SIZE", "2"}}, {"WORLD_SIZE='2'", "RANK"});
  expect_error("LOCAL_RANK without LOCAL_WORLD_SIZE", without(kTorchrun, {"LOCAL_WORLD_SIZE"}),
               {"LOCAL_RANK='1'", "LOCAL_WORLD_SIZE"});
  expect_error("LOCAL_WORLD_SIZE without LOCAL_RANK", without(kTorchrun, {"LOCAL_RANK"}),
               {"LOCAL_WORLD_SIZE='2'", "LOCAL_RANK"});
  expect_error("LOCAL_RANK without RANK", {{"LOCAL_RANK", "0"}}, {"LOCAL_RANK='0'", "RANK"});
  // Even with another launcher present: a half-set torchrun environment is
  // a mistake, not a reason to look elsewhere.
  expect_error("RANK alone over mpirun", with(kOpenMpi, {{"RANK", "1"}}),
               {"RANK='1'", "WORLD_SIZE"});
}

Test(launch_env, open_mpi_pairs_go_together) {
  expect_error("rank alone", without(kOpenMpi, {"OMPI_COMM_WORLD_SIZE"}),
               {"OMPI_COMM_WORLD_RANK='5'", "OMPI_COMM_WORLD_SIZE"});
  expect_error("size alone", without(kOpenMpi, {"OMPI_COMM_WORLD_RANK"}),
               {"OMPI_COMM_WORLD_SIZE='6'", "OMPI_COMM_WORLD_RANK"});
  expect_error("local rank alone", without(kOpenMpi, {"OMPI_COMM_WORLD_LOCAL_SIZE"}),
               {"OMPI_COMM_WORLD_LOCAL_RANK='2'", "OMPI_COMM_WORLD_LOCAL_SIZE"});
}

Test(launch_env, slurm_sets_must_be_complete) {
  expect_error("PROCID without NTASKS", without(kSlurm, {"SLURM_NTASKS"}),
               {"SLURM_PROCID='6'", "SLURM_NTASKS"});
  expect_error("LOCALID without a count per node", without(kSlurm, {"SLURM_NTASKS_PER_NODE"}),
               {"SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  const Env listed = with(without(kSlurm, {"SLURM_NTASKS_PER_NODE"}), {{"SLURM_NODEID", "1"}});
  for (const char* bad : {"", "x", "2(3)", "2(x)", "2(x0)", "2,", "2(x1", ",2"}) {
    const std::string what = std::string("SLURM_TASKS_PER_NODE='") + bad + "'";
    expect_error(what.c_str(), with(listed, {{"SLURM_TASKS_PER_NODE", bad}}), {what});
  }
  expect_error("node beyond the list", with(listed, {{"SLURM_TASKS_PER_NODE", "4"}}),
               {"SLURM_NODEID='1'", "SLURM_TASKS_PER_NODE='4'"});
  expect_error("negative node",
               with(listed, {{"SLURM_TASKS_PER_NODE", "4"}, {"SLURM_NODEID", "-1"}}),
               {"SLURM_NODEID='-1'"});
}

Test(launch_env, several_ranks_need_a_master_address_and_port) {
  expect_error("torchrun without MASTER_ADDR", without(kTorchrun, {"MASTER_ADDR"}),
               {"WORLD_SIZE=8", "MASTER_ADDR"});
  expect_error("torchrun without MASTER_PORT", without(kTorchrun, {"MASTER_PORT"}),
               {"WORLD_SIZE=8", "MASTER_PORT"});
  expect_error("mpirun without MASTER_ADDR", without(kOpenMpi, {"MASTER_ADDR"}),
               {"OMPI_COMM_WORLD_SIZE=6", "MASTER_ADDR", "mpirun", "-x MASTER_ADDR"});
  expect_error("mpirun without MASTER_PORT", without(kOpenMpi, {"MASTER_PORT"}),
               {"MASTER_PORT", "mpirun"});
  expect_error("srun without MASTER_ADDR", without(kSlurm, {"MASTER_ADDR"}),
               {"SLURM_NTASKS=8", "MASTER_ADDR", "srun"});
  expect_error("srun without MASTER_PORT", without(kSlurm, {"MASTER_PORT"}),
               {"MASTER_PORT", "srun"});
  LaunchRequest r;
  r.rank = 0;
  r.world_size = 2;
  expect_error("explicit without master", {}, r, {"world_size=2", "MASTER_ADDR"});
  r.master_addr = "h";
  expect_error("explicit without port", {}, r, {"world_size=2", "MASTER_PORT"});
}

// ---- validation: explicit values ------------------------------------------

Test(launch_env, explicit_values_are_validated) {
  LaunchRequest r;
  r.rank = 1;
  expect_error("rank without world", {}, r, {"rank=1", "world_size"});
  r = {};
  r.world_size = 2;
  expect_error("world without rank", {}, r, {"world_size=2", "rank"});
  r.rank = 2;
  expect_error("rank = world", {}, r, {"rank=2", "world_size=2"});
  r.rank = 0;
  r.world_size = 0;
  expect_error("world 0", {}, r, {"world_size=0"});
  r = {};
  r.local_rank = 0;
  expect_error("local rank alone", {}, r, {"local_rank=0", "local_world_size"});
  r = {};
  r.local_world_size = 2;
  expect_error("local size alone", {}, r, {"local_world_size=2", "local_rank"});
  r.local_rank = 2;
  expect_error("local rank = local size", kTorchrun, r, {"local_rank=2", "local_world_size=2"});
  r.local_rank = 0;
  r.local_world_size = 9;
  expect_error("local size above world", kTorchrun, r, {"local_world_size=9", "WORLD_SIZE=8"});
  for (int port : {0, 65536, 100000}) {
    r = {};
    r.master_port = port;
    const std::string what = "master_port=" + std::to_string(port);
    expect_error(what.c_str(), kTorchrun, r, {what});
  }
  r = {};
  r.master_addr = "a b";
  expect_error("blank address", kTorchrun, r, {"master_addr='a b'"});
}

// ---- the real environment and the log line ---------------------------------

Test(launch_env, process_environment_reads_getenv) {
  const EnvLookup env = pstar::distributed::process_environment();
  const char* path = std::getenv("PATH");
  if (path != nullptr) cr_expect_eq(env("PATH"), std::optional<std::string>(path));
  cr_expect(!env("PSTAR_TEST_SURELY_UNSET_VARIABLE_4711").has_value());
}

Test(launch_env, describe_names_everything) {
  const std::string d = pstar::distributed::describe(resolve(kTorchrun));
  cr_expect_eq(d, std::string("rank 3 of 8 (local 1 of 2) via torchrun, master node0:29500"), "%s",
               d.c_str());
}

// torchrun's agent store: joined when torchrun says it serves one and the
// rendezvous address is its (not given explicitly); keys namespaced per
// restart attempt.
Test(launch_env, torchrun_agent_store_is_joined) {
  Env env = {{"RANK", "1"},        {"WORLD_SIZE", "2"},       {"MASTER_ADDR", "localhost"},
             {"MASTER_PORT", "29500"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
             {"TORCHELASTIC_RESTART_COUNT", "3"}};
  LaunchInfo i = resolve(env);
  cr_expect(i.torch_agent_store);
  cr_expect_eq(i.store_key_prefix, std::string("libpstar/attempt_3/"), "prefix '%s'", i.store_key_prefix.c_str());
  cr_expect(pstar::distributed::describe(i).find("torchrun's store") != std::string::npos);

  env.erase("TORCHELASTIC_RESTART_COUNT");
  i = resolve(env);
  cr_expect_eq(i.store_key_prefix, std::string("libpstar/attempt_0/"));

  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  i = resolve(env);
  cr_expect_not(i.torch_agent_store, "False: rank 0 serves libpstar's own store");
  cr_expect(i.store_key_prefix.empty());

  env.erase("TORCHELASTIC_USE_AGENT_STORE");
  cr_expect_not(resolve(env).torch_agent_store, "unset: rank 0 serves libpstar's own store");
}

Test(launch_env, agent_store_only_for_torchrun_and_its_address) {
  // An explicit rendezvous address is not the agent's store.
  Env env = {{"RANK", "0"},        {"WORLD_SIZE", "2"},       {"MASTER_ADDR", "localhost"},
             {"MASTER_PORT", "29500"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  LaunchRequest r;
  r.master_port = 29600;
  cr_expect_not(resolve(env, r).torch_agent_store);
  // Ranks given explicitly: not torchrun's ranks either.
  LaunchRequest e;
  e.rank = 0;
  e.world_size = 2;
  cr_expect_not(resolve(env, e).torch_agent_store);
  // mpirun's ranks with a stray torchrun variable.
  Env mpi = {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"},
             {"MASTER_PORT", "1"},          {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  cr_expect_not(resolve(mpi).torch_agent_store);
}

Test(launch_env, agent_store_variables_are_validated) {
  const Env base = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}};
  Env env = base;
  env["TORCHELASTIC_USE_AGENT_STORE"] = "true";
  expect_error("lower-case true", env, {}, {"TORCHELASTIC_USE_AGENT_STORE='true'", "'True' nor 'False'"});
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["TORCHELASTIC_RESTART_COUNT"] = "-1";
  expect_error("negative restarts", env, {}, {"TORCHELASTIC_RESTART_COUNT='-1'", "negative"});
  env["TORCHELASTIC_RESTART_COUNT"] = "1x";
  expect_error("restarts not a number", env, {}, {"TORCHELASTIC_RESTART_COUNT='1x'"});
}
