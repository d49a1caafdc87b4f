// optim_device.cuh: the definitions behind optim_device.hpp, for optim_device_*.cu to instantiate
// (nvcc only; no torch).
#pragma once

#include "octet/optim/adamw.cuh"
#include "optim_device.hpp"

namespace octet_torch::device {

template <class Codec, class Master, class Grad>
void adamw_step(const octet::stream_executor& ex, const octet::adamw_state_ref<Codec, Codec, Master>& state,
                octet::span<const Grad> grads, const octet::adamw_hyper& hyper, std::uint64_t step, float lr,
                octet::adamw_report* report) {
    octet::adamw_step(ex, state, grads, hyper, step, lr, report);
}

template <class Grad>
void count_nonfinite(const octet::stream_executor& ex, octet::span<const Grad> grads, octet::adamw_report* report) {
    octet::count_nonfinite(ex, grads, report);
}

}  // namespace octet_torch::device
