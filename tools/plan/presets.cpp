// pstar-plan's presets: the hardware and model shapes of PatrickStar's two
// published single-node experiments (--preset v100x8 and a100x8), with the
// results they reproduce the conditions of and the assumptions each makes
// where the sources are silent.  Kept apart: they are data, cited and
// revised on their own.
#include <string>
#include <vector>

#include "plan.h"

namespace pstar::plan {

// PatrickStar's two single-node experiments (see docs/planner.md for the
// sources).  Model shapes: PatrickStar's benchmark model table
// (examples/model_builder.py: GPT3_18B = 90 layers of hidden 4096, 16 heads;
// GPT_DS_68B = 66 layers of hidden 9216, 16 heads; sequence 1024), built as
// transformers' BertConfig with its default vocabulary of 30522 tokens, with
// activation checkpointing on (examples/run_transformers.sh: CKP=1).
std::vector<Preset> presets() {
  std::vector<Preset> v;
  {
    Preset p;
    p.name = "v100x8";
    p.description = "8 x V100-SXM2-32GB, 240 GB host memory (PatrickStar's WeChat data-center node)";
    p.shape.layers = 90;
    p.shape.hidden = 4096;
    p.shape.heads = 16;
    p.shape.vocab = 30522;
    p.shape.seq = 1024;
    p.shape.batch = 8;
    p.shape.checkpointing = true;
    p.hw.gpus_per_node = 8;
    p.hw.gpu_mem = 32 * kGiB;
    p.hw.host_mem = 240 * kGiB;
    p.hw.h2d = p.hw.d2h = 6e9;
    p.hw.collective = 150e9;
    p.hw.flops = 50e12;
    p.hw.host_adam = 100e9;
    p.hw.device_adam = 900e9;
    p.shape_source = "PatrickStar examples/model_builder.py GPT3_18B";
    p.published = {{"PatrickStar v0.4.3", 18e9, "README: 18B on 8 x V100 with 240 GB host memory"},
                   {"DeepSpeed v0.4.3", 4e9,
                    "4B as given in the planner issue; PatrickStar's README says only that PatrickStar's "
                    "model is over twice as large"}};
    p.assumptions = {"batch 8 per GPU: PatrickStar's sources do not state the batch of the 18B run",
                     "collectives 150 GB/s per GPU each way: NVLink 2.0, six links of 25 GB/s each way (NVIDIA's V100 "
                     "datasheet: 300 GB/s both ways); NCCL reaches less (not modelled)",
                     "link 6 GB/s per GPU each way: PCIe 3.0 x16 (12 GB/s) shared by two GPUs per switch when all "
                     "GPUs copy at once",
                     "50 TFLOP/s sustained per GPU: 40% of the V100's 125 TFLOP/s fp16 tensor-core peak",
                     "host Adam 100 GB/s per node: a two-socket Xeon node (the CPU is not published)",
                     "device Adam 900 GB/s per GPU (hybrid placement): the V100's HBM2 bandwidth"};
    v.push_back(p);
  }
  {
    Preset p;
    p.name = "a100x8";
    p.description = "8 x A100-SXM-80GB, 1 TB host memory (a node of NVIDIA's A100 SuperPOD)";
    p.shape.layers = 66;
    p.shape.hidden = 9216;
    p.shape.heads = 16;
    p.shape.vocab = 30522;
    p.shape.seq = 1024;
    p.shape.batch = 8;
    p.shape.checkpointing = true;
    p.hw.gpus_per_node = 8;
    p.hw.gpu_mem = 80 * kGiB;
    p.hw.host_mem = 1024 * kGiB;
    p.hw.h2d = p.hw.d2h = 12e9;
    p.hw.collective = 300e9;
    p.hw.flops = 125e12;
    p.hw.host_adam = 200e9;
    p.hw.device_adam = 2.0e12;
    p.shape_source = "PatrickStar examples/model_builder.py GPT_DS_68B";
    p.published = {{"PatrickStar v0.4.3", 68e9, "README: 68B on 8 x A100 with 1 TB host memory"},
                   {"DeepSpeed v0.5.7", 0, "README: PatrickStar's 68B is over 6x DeepSpeed's largest"}};
    p.assumptions = {"batch 8 per GPU: PatrickStar's A100 benchmark script sweeps 4, 8 and 16 for its large models",
                     "link 12 GB/s per GPU each way: PCIe 4.0 x16 (24 GB/s) shared by two GPUs per switch",
                     "collectives 300 GB/s per GPU each way: NVLink 3.0, twelve links of 25 GB/s each way (NVIDIA's "
                     "A100 datasheet: 600 GB/s both ways); NCCL reaches less (not modelled)",
                     "125 TFLOP/s sustained per GPU: 40% of the A100's 312 TFLOP/s bf16 tensor-core peak",
                     "host Adam 200 GB/s per node: two AMD EPYC 7742 with 8 DDR4-3200 channels each (409 GB/s peak)",
                     "device Adam 2 TB/s per GPU (hybrid placement): the A100-80GB's HBM2e bandwidth (2.04 TB/s)"};
    v.push_back(p);
  }
  return v;
}

}  // namespace pstar::plan
