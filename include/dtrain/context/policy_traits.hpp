#pragma once
// TEMPORARY: optional members of strategies, precisions and backends with their defaults (to be
// replaced by concept/{strategy,precision,backend}.hpp's traits).

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/files.hpp>
#include <dtrain/detail/memory.hpp>

DTRAIN_NAMESPACE_BEGIN

template <class S>
struct strategy_traits {
  static constexpr bool shards_optimizer = [] {
    if constexpr (requires { S::shards_optimizer; }) return bool(S::shards_optimizer);
    else return false;
  }();
  template <class St>
  static void check_optimizer(const St& s, const std::vector<torch::Tensor>& params) {
    if constexpr (requires { s.check_optimizer(params); }) s.check_optimizer(params);
  }

  template <class St>
  static std::vector<torch::Tensor> parameters(St& s, torch::nn::Module& m) {
    if constexpr (requires { s.parameters(); }) return s.parameters();
    else return m.parameters();
  }
  template <class St, class F>
  static decltype(auto) forward(St& s, F&& f) {
    if constexpr (requires { s.forward([] { return 0; }); }) return s.forward(std::forward<F>(f));
    else return f();
  }
  template <class St>
  static c10::Dict<std::string, at::Tensor> full_state(St& s, torch::nn::Module& m, int rank) {
    if constexpr (requires { s.full_state(); }) return s.full_state();
    else if (rank == 0) return checkpointer::detail::named_state(m, true);
    else return c10::Dict<std::string, at::Tensor>();
  }
  template <class St>
  static std::int64_t held_bytes(const St& s, torch::nn::Module& m) {
    if constexpr (requires { s.held_bytes(); }) return s.held_bytes();
    std::int64_t n = 0;
    for (const auto& p : m.parameters()) n += detail::bytes_of(p) + detail::bytes_of(p.grad());
    return n;
  }
  template <class St>
  static bool load_full_state(St& s, const std::map<std::string, torch::Tensor>& t, const std::string& source) {
    if constexpr (requires { s.load_full_state(t, source); }) {
      s.load_full_state(t, source);
      return true;
    } else {
      return false;
    }
  }
};

template <class P>
struct precision_traits {
  using state = typename P::state;
  static constexpr bool loss_scaling = [] {
    if constexpr (requires { state::loss_scaling; }) return bool(state::loss_scaling);
    else return false;
  }();
  template <class C>
  static state make_state(torch::Device d, C& comm) {
    if constexpr (std::is_constructible_v<state, torch::Device, C&>) return state(d, comm);
    else return state(d);
  }
  static std::int64_t skipped_steps(const state& s) {
    if constexpr (requires { s.skipped_steps(); }) return s.skipped_steps();
    else return 0;
  }
  static double loss_scale(const state& s) {
    if constexpr (requires { s.loss_scale(); }) return s.loss_scale();
    else return 1.0;
  }
};

template <class B>
struct backend_traits {
  static constexpr bool has_batch_transfer = requires { typename B::batch_transfer; };
  template <class C>
  static void on_stall(C& c, std::function<void()> check) {
    if constexpr (requires { c.on_stall(check); }) c.on_stall(std::move(check));
  }
  template <class C>
  static void synchronize(C& c) {
    if constexpr (requires { c.synchronize(); }) c.synchronize();
  }
};

DTRAIN_NAMESPACE_END
