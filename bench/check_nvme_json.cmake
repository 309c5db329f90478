# Runs `pstar-bench nvme` at a small size and checks its JSON object (fixed
# keys, positive figures, the optimizer state on the drive).  No timing
# assertion.
# Usage: cmake -DBENCH=<path to pstar-bench> -DDIR=<scratch directory> -P check_nvme_json.cmake
include(${CMAKE_CURRENT_LIST_DIR}/bench_json.cmake)
file(REMOVE_RECURSE ${DIR})
file(MAKE_DIRECTORY ${DIR})
execute_process(
  COMMAND ${BENCH} nvme --dir ${DIR} --elements 2097152 --chunk-elems 262144 --reps 3 --disk-bytes 33554432 --json
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
file(REMOVE_RECURSE ${DIR})
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pstar-bench nvme exited with ${rc}\nstdout:\n${out}\nstderr:\n${err}")
endif()
string(STRIP "${out}" out)
bench_json_keys("${out}" bench disk_read_gbs disk_write_gbs bound_fraction ratio_vs_host chunks_on_nvme nvme_step_s
                host_step_s bound_fraction_sync nvme_step_s_sync)
if(NOT v_bench STREQUAL "nvme")
  message(FATAL_ERROR "\"bench\" is '${v_bench}'")
endif()
bench_json_positive("${out}" disk_read_gbs disk_write_gbs bound_fraction ratio_vs_host nvme_step_s host_step_s
                    bound_fraction_sync nvme_step_s_sync)
# 2^21 elements in chunks of 2^18: every one of the 8 chunks on the drive.
if(NOT v_chunks_on_nvme EQUAL 8)
  message(FATAL_ERROR "expected 8 chunks on the drive: '${out}'")
endif()
message(STATUS "${out}")
