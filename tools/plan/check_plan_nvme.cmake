# pstar-plan with the NVMe tier on one GPU: the largest model with a drive
# must exceed the largest without it, with its optimizer state partly on the
# drive and the drive's time in the step.  No timing assertion.
# Usage: cmake -DPLAN=<path to pstar-plan> -P check_plan_nvme.cmake
execute_process(
  COMMAND ${PLAN} --gpu-mem 16G --host-mem 64G --host-reserve 4G --flops 100e12 --layers 24 --hidden 2048
          --heads 16 --vocab 50257 --seq 1024 --batch 4 --no-hybrid --nvme 1T --json
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pstar-plan exited with ${rc}\n${out}\n${err}")
endif()
foreach(key nvme_modelled max_params max_params_nvme nvme_used_bytes drive_s_nvme step_s_nvme)
  string(JSON v_${key} ERROR_VARIABLE jerr GET "${out}" ${key})
  if(jerr)
    message(FATAL_ERROR "key \"${key}\" missing")
  endif()
endforeach()
if(NOT v_nvme_modelled STREQUAL "ON" AND NOT v_nvme_modelled STREQUAL "true")
  message(FATAL_ERROR "nvme_modelled is '${v_nvme_modelled}'")
endif()
if(NOT v_max_params_nvme GREATER v_max_params)
  message(FATAL_ERROR "with the drive ${v_max_params_nvme} params, without ${v_max_params}: the drive added nothing")
endif()
if(v_nvme_used_bytes EQUAL 0)
  message(FATAL_ERROR "no optimizer state on the drive at the largest model")
endif()
if(NOT v_step_s_nvme GREATER v_drive_s_nvme)
  message(FATAL_ERROR "step ${v_step_s_nvme} s is not above the drive's ${v_drive_s_nvme} s")
endif()
message(STATUS "largest: ${v_max_params} params in memory, ${v_max_params_nvme} with the drive (${v_nvme_used_bytes} bytes on it, drive ${v_drive_s_nvme} s, step ${v_step_s_nvme} s)")
