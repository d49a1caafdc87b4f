// examples/08_training/flags.hpp: the training program's command line: its presets (quick, full,
// memory), the flags that override them, and the checks that refuse a bad combination before any
// work (exit status 2).
#pragma once

#include "recipes.hpp"
#include "train.hpp"

#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef OCTET_TRAINING_CORPUS
#define OCTET_TRAINING_CORPUS "data/kjv_genesis_exodus.txt"
#endif

namespace train {

struct flags {
    std::string preset = "quick";
    std::vector<std::string> recipes, sizes;
    std::vector<int> seeds, steps;
    int ranks = 2, threads = 0, batch = 16, comparison_seeds = 1;
    float lr = 3e-3f, tolerance = 0.05f;
    bool faults = true, help = false, save_models = false;
    std::string out = "training_report", corpus = OCTET_TRAINING_CORPUS;
    std::string linears = "host";
    std::string moe;  ///< the size-name suffix of --moe (moe_suffix), empty without it
};

inline const char* usage =
    "usage: example_08_training [--preset quick|full|memory] [--recipes a,b,...] [--seeds 0,1,2] [--steps 200,400]\n"
    "                           [--sizes tiny,small] [--ranks N] [--batch N] [--threads N] [--lr X]\n"
    "                           [--tolerance NATS] [--no-faults] [--out FOLDER] [--corpus FILE]\n"
    "                           [--linears host|cuda] [--moe EXPERTS,TOP_K[,EVERY]]\n"
    "  --preset quick  (default) recipes fp32,octet,octet_no_recovery; seeds 0,1,2; 150 steps; size tiny\n"
    "  --preset full   every recipe; seeds 0,1,2; 150 and 300 steps; sizes tiny and small (about 2 h 10 min on 2 "
    "cores)\n"
    "  --preset memory recipes fp32,bf16_mixed,fp8_blockwise,attn_fp8,act_fp8,optim_8bit,grad_bf16,grad_codec,\n"
    "                  octet; seeds 0,1,2; 150 steps; size medium; batch 32; no injected faults (each memory\n"
    "                  mechanism alone, then all)\n"
    "  --recipes       any of: fp32 bf16_mixed bf16 fp8_delayed fp8_tensorwise fp8_blockwise mxfp8 nvfp4 attn_fp8\n"
    "                  attn_matched_per_token_v attn_from_output_per_token_v optim_8bit grad_bf16 grad_codec act_fp8\n"
    "                  octet octet_no_recovery fp32_no_recovery\n"
    "  --ranks         data-parallel ranks (the batch is split over them; default 2): threads of this\n"
    "                  process, or under mpirun (when built with MPI) its processes, one rank each;\n"
    "                  there --ranks may be left out, or must equal the number of processes\n"
    "  --tolerance     largest accepted held-out loss gap to fp32, nats per character (default 0.05)\n"
    "  --comparison-seeds N  runs without recovery (the *_no_recovery recipes) on the first N seeds only\n"
    "                  (default 1: they show what recovery prevents, not a recipe to judge)\n"
    "  --no-faults     no injected gradient corruption and no scripted crash\n"
    "  --save-models   write each run's final weights to FOLDER/models/SIZE_RECIPE_STEPS_seedN.bin\n"
    "                  (model_file.hpp; examples/09_rl starts from one with --init)\n"
    "  --out           output folder for report.md, report.json and the SVG plots (default training_report)\n"
    "  --moe E,K[,N]   beside each size, its mixture-of-experts variant SIZE_moeExK (the MLP of every Nth\n"
    "                  block, default every block: E GELU experts of width d_ff / K, each token routed to\n"
    "                  K of them, as many active MLP parameters as the dense size): float32 runs it with\n"
    "                  octet's routing around float GEMMs, blockwise and mxfp8 recipes in FP8 (octet's MoE\n"
    "                  layer); the report adds the experts' load and the dispatch bytes, FP8 against bf16\n"
    "  --linears cuda  the FP8 linear layers on the CUDA GPU (a build with CUDA; every other part of the\n"
    "                  step stays on the host; not nvfp4): X, W and dY go to the device, Y, dX, dW come back\n";

/// `processes`: the size of the MPI world this process is a rank of (0: not started by mpirun).
inline flags parse_flags(int argc, char** argv, int processes = 0) {
    flags f;
    bool ranks_given = false, batch_given = false;
    auto need = [&](int& i) -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(std::string(argv[i]) + " needs a value");
        return argv[++i];
    };
    auto ints = [](const std::string& flag, const std::string& v) {
        std::vector<int> out;
        for (const auto& s : split(v)) {
            char* end = nullptr;
            const long x = std::strtol(s.c_str(), &end, 10);
            if (*end || x < 0) throw std::invalid_argument(flag + ": '" + s + "' is not a non-negative integer");
            out.push_back(static_cast<int>(x));
        }
        return out;
    };
    std::vector<std::string> recipes, sizes;
    std::vector<int> seeds, steps;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            f.help = true;
            return f;
        } else if (a == "--preset") {
            f.preset = need(i);
            if (f.preset != "quick" && f.preset != "full" && f.preset != "memory")
                throw std::invalid_argument("--preset: '" + f.preset + "' (use quick, full or memory)");
        } else if (a == "--recipes") {
            recipes = split(need(i));
        } else if (a == "--sizes") {
            sizes = split(need(i));
        } else if (a == "--seeds") {
            seeds = ints(a, need(i));
        } else if (a == "--steps") {
            steps = ints(a, need(i));
        } else if (a == "--ranks") {
            f.ranks = ints(a, need(i)).at(0);
            ranks_given = true;
        } else if (a == "--batch") {
            f.batch = ints(a, need(i)).at(0);
            batch_given = true;
        } else if (a == "--threads") {
            f.threads = ints(a, need(i)).at(0);
        } else if (a == "--lr") {
            f.lr = std::strtof(need(i).c_str(), nullptr);
        } else if (a == "--comparison-seeds") {
            f.comparison_seeds = ints(a, need(i)).at(0);
        } else if (a == "--tolerance") {
            f.tolerance = std::strtof(need(i).c_str(), nullptr);
        } else if (a == "--save-models") {
            f.save_models = true;
        } else if (a == "--no-faults") {
            f.faults = false;
        } else if (a == "--out") {
            f.out = need(i);
        } else if (a == "--corpus") {
            f.corpus = need(i);
        } else if (a == "--moe") {
            const std::vector<int> v = ints(a, need(i));
            if (v.size() < 2 || v.size() > 3 || v[0] < 1 || v[1] < 1 || (v.size() == 3 && v[2] < 1))
                throw std::invalid_argument("--moe: pass EXPERTS,TOP_K or EXPERTS,TOP_K,EVERY (positive integers)");
            f.moe = moe_suffix(v[0], v[1], v.size() == 3 ? v[2] : 1);
        } else if (a == "--linears") {
            f.linears = need(i);
            if (f.linears != "host" && f.linears != "cuda")
                throw std::invalid_argument("--linears: '" + f.linears + "' (use host or cuda)");
        } else {
            throw std::invalid_argument("unknown flag " + a);
        }
    }
    if (f.preset == "quick") {
        f.recipes = {"fp32", "octet", "octet_no_recovery"};
        f.sizes = {"tiny"};
        f.seeds = {0, 1, 2};
        f.steps = {150};
    } else if (f.preset == "memory") {
        // Proportions nearer real training: the largest size at twice the default batch, so that
        // weights and optimizer state weigh beside the activations; each memory mechanism alone,
        // then all of octet; the quick default's length, so each has its loss cost beside it.
        f.recipes = {"fp32",       "bf16_mixed", "fp8_blockwise", "attn_fp8", "act_fp8",
                     "optim_8bit", "grad_bf16",  "grad_codec",    "octet"};
        f.sizes = {"medium"};
        f.seeds = {0, 1, 2};
        f.steps = {150};
        if (!batch_given) f.batch = 32;
        // A training step's memory: no injected faults, so no repeated step raised to float32
        // (its float copies, the recovery's cost, are the quick default's to show).
        f.faults = false;
    } else {
        for (const auto& r : all_recipes()) f.recipes.push_back(r.name);
        f.sizes = {"tiny", "small"};
        f.seeds = {0, 1, 2};
        f.steps = {150, 300};
    }
    if (!recipes.empty()) f.recipes = recipes;
    if (!sizes.empty()) f.sizes = sizes;
    if (!seeds.empty()) f.seeds = seeds;
    if (!steps.empty()) f.steps = steps;
    if (!f.moe.empty()) {  // each size, then its mixture-of-experts variant
        std::vector<std::string> with;
        for (const auto& s : f.sizes) with.insert(with.end(), {s, s + f.moe});
        f.sizes = with;
    }
    if (processes > 0) {
        if (ranks_given && f.ranks != processes)
            throw std::invalid_argument(
                "--ranks " + std::to_string(f.ranks) + " under mpirun with " + std::to_string(processes) +
                " processes: each process is one rank; pass --ranks " + std::to_string(processes) + " or leave it out");
        f.ranks = processes;
    }
    if (f.ranks < 1) throw std::invalid_argument("--ranks must be at least 1");
    if (f.batch < f.ranks || f.batch % f.ranks)
        throw std::invalid_argument(
            "--batch must be a positive multiple of --ranks (each rank gets batch / ranks sequences)");
    for (int s : f.steps)
        if (s < 10) throw std::invalid_argument("--steps: each length must be at least 10");
    if (f.lr <= 0 || !std::isfinite(f.lr)) throw std::invalid_argument("--lr must be a positive number");
    if (!(f.tolerance > 0) || !std::isfinite(f.tolerance))
        throw std::invalid_argument("--tolerance must be a positive number");
    return f;
}

}  // namespace train
