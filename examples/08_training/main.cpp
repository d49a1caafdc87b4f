// examples/08_training: the main job. A small decoder-only transformer learns to write like the
// King James Genesis and Exodus (data/kjv_genesis_exodus.txt, characters as tokens), trained in
// several recipes side by side, every step built from octet: FP8 linear layers
// (octet/nn/linear.hpp: forward, data and weight gradient from the recipe's row- and column-wise
// copies), FP8 attention forward and backward with a delta mode, AdamW with 8-bit moments over
// bf16 master weights, the gradient codec with error feedback across data-parallel ranks
// (octet::compressed_allreduce; ranks are threads of one process, or processes under mpirun),
// monitors that check every step BEFORE its update is
// applied, and a recovery policy. It validates in the order the background essay asks:
//   1. a gate of invariants on small controlled cases (gate.hpp); the run refuses to train if it fails;
//   2. curves at the lengths and sizes asked for;  3. every recipe over several seeds;
//   4. held-out loss in bits per character and a generated sample per recipe.
// and writes report.md, report.json (schema: report_schema.md) and SVG plots to the output folder.
//
// The program's files: flags.hpp (command line, presets), recipes.hpp, gate.hpp (its checks in
// gate/), trainer.hpp (one run, in named parts: setup, step(), the checkpointer, the evaluator, the
// recovery wiring, with optimizer.hpp, gradients.hpp, gradient_exchange.hpp, step_checks.hpp,
// checkpointer.hpp, evaluator.hpp, ledger.hpp), faults.hpp (the injected faults, through a hook the
// trainer calls), report.hpp (its parts in report/), ranks.hpp / mpi_ranks.hpp; the model, corpus,
// model files, meter and report kit are the examples' shared library (examples/common). This file:
// the sweep, the verdicts, main().
//
// Run:  cmake --workflow --preset demo        (the quick default; build/demo/examples/example_08_training)
//       example_08_training --preset full     (every recipe, 3 seeds, 2 lengths, 2 sizes)
//       example_08_training --preset memory   (each memory mechanism alone and all, size medium, batch 32)
//       example_08_training --help
//       mpiexec -n 2 example_08_training ...   (built with MPI: each process is one rank; rank 0
//                                               prints and writes the report)
// Exit status: 0 when the gate passes and every FP8 recipe ends within the stated tolerance of
// float32 on the same seeds; 1 otherwise; 2 on bad flags.
#include <octet/octet.hpp>

#include "common/corpus.hpp"
#include "common/model.hpp"
#include "common/model_file.hpp"
#include "gate.hpp"
#if TRAIN_HAS_CUDA_LINEARS
#include "cuda_linear.hpp"
#endif
#include "ranks.hpp"
#ifdef OCTET_TRAINING_MPI
#include "mpi_ranks.hpp"
#endif
#include "faults.hpp"
#include "flags.hpp"
#include "recipes.hpp"
#include "report.hpp"
#include "train.hpp"
#include "trainer.hpp"
#include "verdicts.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace train {

/// The program. `procs`: the processes' ranks under mpirun (nullptr: the ranks are threads of this
/// process). Rank 0 alone prints and writes the report; every rank returns the same exit status.
int run_program(int argc, char** argv, process_ranks* procs) {
    const int rank = procs ? procs->rank() : 0;
    const bool lead = rank == 0;
    flags f;
    try {
        f = parse_flags(argc, argv, procs ? procs->size() : 0);
    } catch (const std::exception& e) {
        // Every rank parses the same flags and fails alike; rank 0 says why.
        if (lead) std::fprintf(stderr, "example_08_training: %s\n%s", e.what(), usage);
        return 2;
    }
    if (f.help) {
        if (lead) std::fputs(usage, stdout);
        return 0;
    }
    const auto wall0 = clock_type::now();
    // Processes of one mpirun on one machine share its cores.
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int threads = f.threads > 0 ? f.threads : std::max(1, cores / (procs ? procs->processes_here() : 1));
    octet::thread_pool pool(static_cast<std::size_t>(threads));
    const octet::host_executor ex = octet::on_host(pool);

    sweep_result sweep;
    for (int i = 0; i < argc; ++i) sweep.command += (i ? " " : "") + std::string(argv[i]);
    sweep.machine = report_detail::machine_description(threads);
    if (procs)
        sweep.machine += " per process; " + std::to_string(procs->size()) +
                         " MPI processes, one rank each (times and memory: rank 0's process)";

    // 1. The gate, on every rank: each process checks the numerics it will train with (the ranks
    // of one mpirun may run on different machines); one failure stops every rank.
    if (lead) std::printf("octet %s training demo: gate ...\n", OCTET_VERSION_STRING);
    sweep.gate = run_gate(ex, 20261202u);
    const bool gate_ok = gate_passed(sweep.gate);
    for (const auto& g : sweep.gate) {
        if (lead)
            std::printf("  %-4s %-44s %.3g (limit %.3g)\n", g.passed ? "ok" : "FAIL", g.name.c_str(), g.value, g.limit);
        else if (!g.passed)
            std::fprintf(stderr, "example_08_training: rank %d: gate FAIL %s %.3g (limit %.3g)\n", rank, g.name.c_str(),
                         g.value, g.limit);
    }
    const int failed_rank = procs ? procs->allreduce_max(gate_ok ? -1 : rank) : (gate_ok ? -1 : 0);
    if (failed_rank >= 0) {
        sweep.passed = false;
        sweep.verdicts.push_back(procs ? "the gate failed on rank " + std::to_string(failed_rank) +
                                             " (the highest failing rank): no training was run"
                                       : "the gate failed: no training was run");
        if (lead) {
            write_report(sweep, f.out);
            std::printf("The gate failed; the run refuses to train. Report: %s/report.md\n", f.out.c_str());
        }
        return 1;
    }

    // The corpus and the output folder are each process's own (one machine may lack the file):
    // the ranks agree before any of them starts training.
    corpus data;
    std::vector<recipe_config> recipes;
    std::string problem;
    try {
        data = load_corpus(f.corpus);
        const auto known = all_recipes();
        for (const auto& name : f.recipes) {
            auto it = std::find_if(known.begin(), known.end(), [&](const recipe_config& r) { return r.name == name; });
            if (it == known.end()) throw std::invalid_argument("--recipes: unknown recipe '" + name + "'");
            recipes.push_back(*it);
        }
        for (const auto& s : f.sizes)
            if (size_config(s).moe()) {
                for (const auto& r : recipes)
                    if (*moe_mode_refusal(r.linear) != '\0')
                        throw std::invalid_argument("size " + s + " with recipe " + r.name + ": " +
                                                    moe_mode_refusal(r.linear) + " (or leave out --moe)");
                if (f.linears == "cuda")
                    throw std::invalid_argument("size " + s +
                                                ": the mixture of experts runs on the host; leave out --linears cuda");
            }
        if (f.linears == "cuda") {
#if TRAIN_HAS_CUDA_LINEARS
            std::string why;
            const std::string gpu = train::cuda_linear_device(&why);
            if (gpu.empty()) throw std::invalid_argument("--linears cuda: " + why);
            for (auto& r : recipes) {
                const std::string refusal = train::cuda_linear_refusal(r.linear);
                if (!refusal.empty()) throw std::invalid_argument("--linears cuda: recipe " + r.name + ": " + refusal);
                r.make_linear = &train::make_cuda_linear_layer;
            }
            sweep.machine += "; FP8 linears on CUDA (" + gpu + ")";
#else
            throw std::invalid_argument(
                "--linears cuda: this build has no CUDA (configure with -DOCTET_ENABLE_CUDA=ON)");
#endif
        }
        std::filesystem::create_directories(f.out);
    } catch (const std::exception& e) {
        problem = e.what();
    }
    const int failed = procs ? procs->allreduce_max(!problem.empty()) : !problem.empty();
    if (failed) {
        if (!problem.empty())
            std::fprintf(stderr, "example_08_training: %s%s\n%s",
                         procs ? ("rank " + std::to_string(rank) + ": ").c_str() : "", problem.c_str(),
                         lead ? usage : "");
        else if (lead)
            std::fprintf(stderr, "example_08_training: another rank could not start (its message says why)\n");
        return 2;
    }

    // 2.-4. Every (size, length, recipe, seed).
    double total_steps = 0;
    for (std::size_t s = 0; s < f.sizes.size(); ++s)
        for (int st : f.steps)
            for (const auto& rc : recipes)
                total_steps +=
                    static_cast<double>(st) *
                    (rc.recovery ? f.seeds.size()
                                 : std::min<std::size_t>(f.seeds.size(), static_cast<std::size_t>(f.comparison_seeds)));
    if (lead)
        std::printf(
            "training: %zu recipes x %zu seeds x %zu lengths x %zu sizes on %s (%zu characters, %zu held out)\n",
            recipes.size(), f.seeds.size(), f.steps.size(), f.sizes.size(), sweep.machine.c_str(),
            data.train.size() + data.heldout.size(), data.heldout.size());
    // A test hook: this rank throws at step 1 of its first run (the test that an error on one rank
    // ends every rank with its message, instead of leaving the others blocked in a collective).
    const char* fail_env = std::getenv("OCTET_TRAINING_FAIL_RANK");
    const int fail_rank = fail_env ? std::atoi(fail_env) : -1;
    progress bar(total_steps, lead ? stdout : nullptr, /*plain=*/procs != nullptr);
    for (const auto& size_name : f.sizes) {
        model_config mc = size_config(size_name);
        mc.vocab = static_cast<int>(data.alphabet.size());
        for (int steps : f.steps)
            for (const auto& rc : recipes)
                for (std::size_t si = 0; si < f.seeds.size(); ++si) {
                    const int seed = f.seeds[si];
                    if (!rc.recovery && static_cast<int>(si) >= f.comparison_seeds) continue;
                    run_options o;
                    o.size = mc, o.recipe = rc, o.seed = seed, o.steps = steps, o.ranks = f.ranks;
                    o.batch = f.batch, o.lr = f.lr, o.ex = ex, o.threads = threads;
                    o.scratch = f.out, o.procs = procs;
                    if (f.save_models) {
                        std::filesystem::create_directories(f.out + "/models");
                        o.save_model = f.out + "/models/" + size_name + "_" + rc.name + "_" + std::to_string(steps) +
                                       "_seed" + std::to_string(seed) + ".bin";
                    }
                    const std::string label =
                        size_name + " " + std::to_string(steps) + " steps " + rc.name + " seed " + std::to_string(seed);
                    scripted_faults faults(steps, checkpoint_interval(steps), f.faults, fail_rank);
                    trainer run(o, data, faults);
                    run_result r = run.run([&](double units) { bar.advance(units, label); });
                    sweep.runs.push_back(std::move(r));
                }
    }
    bar.finish();
    std::filesystem::remove(checkpoint_path(f.out, procs));
    if (!lead) return procs->allreduce_max(0);  // rank 0's exit status

    judge(sweep, recipes, f.tolerance);
    sweep.wall_seconds = seconds_since(wall0);
    write_report(sweep, f.out);

    std::printf("\n");
    for (const auto& v : sweep.verdicts) std::printf("  %s\n", v.c_str());
    std::printf("\nreport: %s/report.md, %s/report.json, plots %s/*.svg (%.0f s)\n", f.out.c_str(), f.out.c_str(),
                f.out.c_str(), sweep.wall_seconds);
    const int status = sweep.passed ? 0 : 1;
    return procs ? procs->allreduce_max(status) : status;
}

}  // namespace train

int main(int argc, char** argv) {
#ifdef OCTET_TRAINING_MPI
    // Under mpirun (with more than one process) each process is one rank; otherwise the ranks are
    // threads of this process and MPI is never initialized.
    std::unique_ptr<train::mpi_session> session;
    std::unique_ptr<train::mpi_ranks> procs;
    try {
        if (train::started_by_mpi_launcher()) {
            session = std::make_unique<train::mpi_session>(argc, argv);
            procs = std::make_unique<train::mpi_ranks>();
            if (procs->size() == 1) procs.reset();  // mpirun -n 1: in-process ranks
        }
        return train::run_program(argc, argv, procs.get());
    } catch (const std::exception& e) {
        if (!procs) {
            std::fprintf(stderr, "example_08_training: %s\n", e.what());
            return 1;
        }
        // The other ranks may wait in a collective for this one: end them all.
        std::fprintf(stderr, "example_08_training: rank %d of %d: %s; ending every rank\n", procs->rank(),
                     procs->size(), e.what());
        std::fflush(stderr);
        train::abort_all_ranks(1);
    }
#else
    try {
        return train::run_program(argc, argv, nullptr);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "example_08_training: %s\n", e.what());
        return 1;
    }
#endif
}
