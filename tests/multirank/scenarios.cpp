// SPDX-License-Identifier: Apache-2.0
// Multi-process scenarios for the multirank tests: each run is a real driver that starts real
// workers over Gloo on loopback. test_multirank.cpp runs this program and checks what it prints.
//
//   scenarios <scenario> [--workers N] [--threads N] [--steps K] [--batch B] [--out FILE] [--tag T]
//
// Sharded (strategy::fsdp<>) scenarios, each also run under ddp<> for comparison:
//   scenarios fsdp_train --strategy ddp|fsdp|fsdp_grad_op [--accumulate 1] [--resume-from DIR]
//       [--restore weights|all] [--checkpoint 1] [--out FILE]   Adam on a small model; --out saves
//       rank 0's full parameters and buffers
//   scenarios fsdp_memory --strategy ddp|fsdp    a ~9.5M-parameter MLP; reports the model state bytes
//   scenarios fsdp_bad_optimizer                 fsdp<> with an optimizer over model->parameters()
//   scenarios collectives --workers N            the communicator's flat allgather and reduce_scatter
//   scenarios mismatch --variant V               ranks issue different collectives (V: allgather_vs_sum,
//       count: 3 values against 1, gloo_path: a list allgather against a max allreduce, by_host: the
//       first half of the ranks an allgather, the others ctx.all_reduce(42.0 sum), last_rank: as
//       allgather_vs_sum with the last rank's allgather); must fail
//   scenarios embedding --variant sparse|dense [--strategy ddp|fsdp]   an Embedding (made sparse or
//       not) -> mean -> Linear, Adam; step 4 accumulates a no_sync backward, and under ddp rank 1
//       leaves the embedding out of step 2; --out saves rank 0's full parameters
//   scenarios hierarchical                       under a launcher's variables with DTRAIN_HOST_ID faking
//       hosts: the hierarchical allreduce's results, bitwise, and the other collectives beside it

#include <dtrain/backend/detail/gloo_peers.hpp>  // run_gloo_group: a Gloo group of its own
#include <dtrain/dtrain.hpp>
#include <dtrain/evaluation/predictor.hpp>  // evaluate: a Predictor over the trained model

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>
#include <thread>

#include <sys/resource.h>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

namespace {

struct Args {
  std::string scenario;
  int workers = 2, threads = 1, steps = 6;
  std::int64_t batch = 32;
  std::string out, storage = "multirank_runs";
  int rendezvous_ms = 20000;
  int step_ms = 0;  // a pause in each step: a run that lasts while a test does something to it
  std::string strategy = "ddp", resume_from, restore = "weights", variant = "allgather_vs_sum";
  bool accumulate = false, checkpoint = false;
};

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2) throw std::invalid_argument("usage: scenarios <scenario> [--flag value]...");
  a.scenario = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--workers") a.workers = std::stoi(v);
    else if (f == "--threads") a.threads = std::stoi(v);
    else if (f == "--steps") a.steps = std::stoi(v);
    else if (f == "--batch") a.batch = std::stoll(v);
    else if (f == "--out") a.out = v;
    else if (f == "--storage") a.storage = v;
    else if (f == "--rendezvous-ms") a.rendezvous_ms = std::stoi(v);
    else if (f == "--step-ms") a.step_ms = std::stoi(v);
    else if (f == "--strategy") a.strategy = v;
    else if (f == "--resume-from") a.resume_from = v;
    else if (f == "--restore") a.restore = v;
    else if (f == "--variant") a.variant = v;
    else if (f == "--accumulate") a.accumulate = v == "1";
    else if (f == "--checkpoint") a.checkpoint = v == "1";
    else if (f == "--tag") {}  // only marks the processes, for the orphan checks
    else throw std::invalid_argument("unknown flag " + f);
  }
  return a;
}

// A fixed synthetic classification set: the same on every rank and in every run.
dtrain::data::TensorDataset synthetic(std::int64_t n, std::int64_t features) {
  auto gen = at::detail::createCPUGenerator(1234);
  auto x = at::randn({n, features}, gen);
  auto y = at::randint(0, 10, {n}, gen);
  return {x, y};
}

torch::nn::Sequential small_model(std::int64_t features, std::int64_t hidden) {
  using namespace torch::nn;
  return Sequential(Linear(features, hidden), Tanh(), Linear(hidden, hidden), Tanh(), Linear(hidden, 10));
}

using Trainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset>;
// Loss scaling on CPU: bf16 autocast with the GradScaler fp16 uses on GPUs.
using ScaledTrainer =
    dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset,
                    dtrain::precision::amp<dtrain::precision::bf16, dtrain::precision::dynamic_loss_scale>>;

// The sharded scenarios' trainers: the same loop under ddp<> and two fsdp<> configurations.
template <class Strategy>
using CheckpointingTrainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset,
                                             dtrain::checkpointer::directory<false>, Strategy>;
using DdpTrainer = CheckpointingTrainer<dtrain::strategy::ddp<>>;
using FsdpTrainer = CheckpointingTrainer<dtrain::strategy::fsdp<>>;  // full_shard, top_level
using FsdpGradOpTrainer = CheckpointingTrainer<
    dtrain::strategy::fsdp<dtrain::strategy::sharding::shard_grad_op, dtrain::strategy::wrap::whole_model>>;

// BatchNorm gives the model buffers (broadcast from rank 0 like ddp<>'s) and four units.
torch::nn::Sequential bn_model(std::int64_t features, std::int64_t hidden) {
  using namespace torch::nn;
  return Sequential(Linear(features, hidden), BatchNorm1d(hidden), Tanh(), Linear(hidden, hidden), Tanh(),
                    Linear(hidden, 10));
}

// About 9.5M parameters: 512*2048 + 2*2048*2048 + 2048*10 weights and their biases.
torch::nn::Sequential big_model() {
  using namespace torch::nn;
  return Sequential(Linear(512, 2048), ReLU(), Linear(2048, 2048), ReLU(), Linear(2048, 2048), ReLU(),
                    Linear(2048, 10));
}

// Page faults this process took so far (the kernel mapping in a page it had not touched).
double minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_minflt);
}

template <class T>
int run_sharded(const Args& a) {
  const bool memory = a.scenario == "fsdp_memory";
  const std::int64_t features = memory ? 512 : 20;
  const auto data = synthetic(memory ? 256 : 1024, features);
  dtrain::RunConfig run{.storage_path = a.storage, .name = a.scenario + "_" + a.strategy,
                        .rendezvous_timeout = std::chrono::milliseconds(a.rendezvous_ms),
                        .collective_timeout = std::chrono::seconds(60)};
  if (!a.resume_from.empty()) run.resume_from = a.resume_from;
  T trainer({.num_workers = a.workers, .threads_per_worker = a.threads}, run);
  const auto result = trainer.fit([&](typename T::context& ctx) {
    torch::manual_seed(ctx.world_rank() + 7);  // prepare_model must make the ranks agree
    auto model = ctx.prepare_model(memory ? big_model() : bn_model(features, 32));
    std::vector<torch::Tensor> params =
        a.scenario == "fsdp_bad_optimizer" ? model->parameters() : ctx.parameters(model);
    torch::optim::Adam adam(params, torch::optim::AdamOptions(memory ? 1e-4 : 1e-2));
    if (auto ck = ctx.get_checkpoint()) {
      if (a.restore == "all") ctx.restore(*ck, model, adam);
      else ctx.restore(*ck, model);
    }
    model->train();
    int step = 0;
    double held_after_forward = -1;  // fsdp<>: bytes held between the first forward and its backward
    double faults_after_warmup = -1;  // once 2 steps have run: what later steps fault in is per step
    // The step count is checked after each batch, so that a checkpoint's sampler position counts
    // only the batches trained on.
    for (auto epoch : ctx.epochs(1000)) {
      (void)epoch;
      if (step == a.steps) break;
      for (auto batch : ctx.shard(data, a.batch)) {
        auto loss = torch::nn::functional::cross_entropy(ctx.forward(model, batch.data), batch.target);
        if constexpr (requires { ctx.strategy().held_bytes(); })
          if (step == 0) held_after_forward = static_cast<double>(ctx.strategy().held_bytes());
        // --accumulate: every third batch only accumulates (no_sync), the next one steps on both.
        if (a.accumulate && step % 3 == 0) {
          auto guard = ctx.no_sync();
          ctx.backward(loss);
        } else {
          ctx.backward(loss);
          ctx.step(adam);
          adam.zero_grad();
        }
        if (++step == 2) faults_after_warmup = minor_faults();
        if (step == a.steps) break;
      }
      if (step == a.steps) break;  // before the next epoch starts (and resets the position)
    }
    const double faults_per_step = ctx.all_reduce(step > 2 ? (minor_faults() - faults_after_warmup) / (step - 2) : -1.0,
                                                  dtrain::reduce::max);
    const double state_bytes = ctx.all_reduce(static_cast<double>(ctx.model_state_bytes(model, adam)), dtrain::reduce::max);
    const double rss = ctx.all_reduce(dtrain::launch::peak_rss_mb(), dtrain::reduce::max);
    std::int64_t n_params = 0;
    const auto full = ctx.full_state(model);  // a collective under fsdp<>: every rank calls it
    if (ctx.world_rank() == 0) {
      for (const auto& kv : full) if (model->named_parameters().contains(kv.key())) n_params += kv.value().numel();
      if (!a.out.empty()) {
        std::vector<torch::Tensor> tensors;
        for (const auto& kv : model->named_parameters()) tensors.push_back(full.at(kv.key()));
        for (const auto& kv : model->named_buffers()) tensors.push_back(full.at(kv.key()));
        torch::save(tensors, a.out);
      }
    }
    dtrain::Metrics m{{"state_bytes", state_bytes}, {"peak_rss_mb", rss}, {"params", n_params},
                      {"world", ctx.world_size()}, {"steps_taken", step},
                      {"faults_per_step", faults_per_step}};
    if constexpr (requires { ctx.strategy().stats().reduce_scatters; }) {
      const auto& st = ctx.strategy().stats();
      m["units"] = st.units;
      m["allgathers"] = st.allgathers;
      m["reduce_scatters"] = st.reduce_scatters;
      m["synced_steps"] = st.synced_steps;
      m["held_after_forward"] = held_after_forward;
    } else {
      m["synced_steps"] = ctx.strategy().stats().synced_steps;
    }
    if (a.checkpoint) ctx.report(m, ctx.checkpoint(model, adam));
    else ctx.report(m);
  });
  std::cout << "RESULT";
  for (const auto& [k, v] : result.metrics) std::cout << ' ' << k << '=' << v.text();
  std::cout << " latest=" << (result.latest_checkpoint() ? result.latest_checkpoint()->path().string() : "-")
            << std::endl;
  return 0;
}

// The embedding scenario's model: a bag of embeddings, the lookup's gradient sparse or dense.
struct BagImpl : torch::nn::Module {
  explicit BagImpl(bool sparse)
      : embedding(register_module("embedding", torch::nn::Embedding(torch::nn::EmbeddingOptions(64, 8).sparse(sparse)))),
        head(register_module("head", torch::nn::Linear(8, 10))) {}
  torch::Tensor forward(const torch::Tensor& ids) { return head(embedding(ids).mean(1)); }
  torch::nn::Embedding embedding;
  torch::nn::Linear head;
};
TORCH_MODULE(Bag);

template <class BagTrainer>
int run_embedding(const Args& a) {
  constexpr bool sharded = !std::is_same_v<typename BagTrainer::policies::strategy, dtrain::strategy::ddp<>>;
  auto gen = at::detail::createCPUGenerator(99);
  const dtrain::data::TensorDataset data(at::randint(0, 64, {512, 6}, gen), at::randint(0, 10, {512}, gen));
  BagTrainer trainer({.num_workers = a.workers, .threads_per_worker = 1},
                     {.storage_path = a.storage, .name = "embedding_" + a.variant + "_" + a.strategy,
                      .collective_timeout = std::chrono::seconds(60), .start = dtrain::Start::fresh});
  const auto result = trainer.fit([&](typename BagTrainer::context& ctx) {
    torch::manual_seed(ctx.world_rank() + 7);
    auto model = ctx.prepare_model(Bag(a.variant == "sparse"));
    torch::optim::Adam adam(ctx.parameters(model), torch::optim::AdamOptions(1e-2));
    int step = 0;
    double grad_sparse = 1, rows_reduced = 0;
    for (auto batch : ctx.shard(data, a.batch)) {
      auto loss_of = [&] {
        // Rank 1 leaves the embedding out of step 2: it has no gradient there, rank 0 has one
        // (under ddp<>: fsdp<> reaches parameters only through ctx.forward).
        if (!sharded && step == 2 && ctx.world_rank() == 1)
          return torch::nn::functional::cross_entropy(model->head(torch::zeros({batch.target.size(0), 8})), batch.target);
        return torch::nn::functional::cross_entropy(ctx.forward(model, batch.data), batch.target);
      };
      adam.zero_grad();
      if (step == 4) {  // a micro-batch accumulated locally first
        auto guard = ctx.no_sync();
        ctx.backward(loss_of());
      }
      ctx.backward(loss_of());
      if constexpr (!sharded) {  // fsdp<> keeps the gradients in its flat shards
        const auto g = model->embedding->weight.grad();
        grad_sparse = std::min(grad_sparse, g.is_sparse() ? 1.0 : 0.0);
        if (g.is_sparse()) rows_reduced = std::max(rows_reduced, static_cast<double>(g._nnz()));
        ctx.step(adam);
        if (!model->embedding->weight.grad().is_same(g))
          throw std::runtime_error("ctx.step did not give the gradient back");
      } else {
        ctx.step(adam);
      }
      if (++step == a.steps) break;
    }
    std::vector<torch::Tensor> params;  // rank 0's full parameters
    for (const auto& kv : ctx.full_state(model))  // a collective under fsdp<>: every rank calls it
      if (model->named_parameters().contains(kv.key())) params.push_back(kv.value().detach().clone());
    if (ctx.world_rank() == 0 && !a.out.empty()) torch::save(params, a.out);
    double checksum = 0;  // under ddp<> every rank holds the whole model: they must agree
    if constexpr (!sharded)
      for (const auto& p : model->parameters()) checksum += p.sum().template item<double>();
    ctx.report({{"ranks_agree", ctx.all_reduce(checksum, dtrain::reduce::max) == ctx.all_reduce(checksum, dtrain::reduce::min)},
                {"grad_sparse", grad_sparse}, {"rows_reduced", rows_reduced}, {"steps_taken", step}});
  });
  std::cout << "RESULT";
  for (const auto& [k, v] : result.metrics) std::cout << ' ' << k << '=' << v.text();
  std::cout << std::endl;
  return 0;
}

// Ranks that issue different collectives at the same point, as a branch on the rank would: the
// run must fail naming both calls, never hand one rank the other's bytes. A run that returns
// normally prints RESULT and exits 0, which the test counts as the bug.
// ctx.graphed_step on CPU workers: refused when the step is made (CUDA graphs capture GPU work).
int run_graphed_on_cpu(const Args& a) {
  Trainer trainer({.num_workers = a.workers}, {.storage_path = a.storage, .name = a.scenario});
  trainer.fit([&](Trainer::context& ctx) {
    auto model = ctx.prepare_model(small_model(8, 4));
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    auto step = ctx.graphed_step(sgd, [&](const torch::Tensor& x, const torch::Tensor& y) {
      return torch::nn::functional::cross_entropy(model->forward(x), y);
    });
    step(torch::randn({4, 8}), torch::zeros({4}, torch::kLong));
  });
  return 0;
}

int run_mismatch(const Args& a) {
  Trainer trainer({.num_workers = a.workers},
                  {.storage_path = a.storage, .name = a.scenario, .collective_timeout = std::chrono::seconds(20)});
  const auto result = trainer.fit([&](Trainer::context& ctx) {
    auto& comm = ctx.communicator();
    const int r = ctx.world_rank();
    ctx.all_reduce(1.0, dtrain::reduce::sum);  // a matching one first: the check must not misfire
    double got = 0;
    if (a.variant == "allgather_vs_sum" || a.variant == "last_rank") {
      if (r == (a.variant == "last_rank" ? ctx.world_size() - 1 : 0)) {
        auto out = torch::zeros({ctx.world_size()}, torch::kFloat64);
        comm.allgather(out, torch::full({1}, 7.0, torch::kFloat64)).wait();
        got = out[0].item<double>();
      } else {
        got = ctx.all_reduce(42.0, dtrain::reduce::sum);
      }
    } else if (a.variant == "count") {
      auto t = torch::ones({r == 0 ? 3 : 1}, torch::kFloat64);
      comm.allreduce(t, dtrain::reduce::sum).wait();
      got = t[0].item<double>();
    } else if (a.variant == "gloo_path") {
      if (r == 0) {
        std::vector<torch::Tensor> out(ctx.world_size(), torch::zeros({2}, torch::kInt64));
        for (auto& t : out) t = torch::zeros({2}, torch::kInt64);
        comm.allgather(out, torch::ones({2}, torch::kInt64)).wait();
      } else {
        got = ctx.all_reduce(42.0, dtrain::reduce::max);
      }
    } else if (a.variant == "by_host") {
      if (r < ctx.world_size() / 2) {
        auto out = torch::zeros({ctx.world_size()}, torch::kFloat64);
        comm.allgather(out, torch::full({1}, 7.0, torch::kFloat64)).wait();
      } else {
        got = ctx.all_reduce(42.0, dtrain::reduce::sum);
      }
    } else {
      throw std::invalid_argument("--variant must be allgather_vs_sum, last_rank, count, gloo_path or by_host");
    }
    ctx.report({{"got", got}});
  });
  std::cout << "RESULT got=" << result.metrics.at("got").text() << std::endl;
  return 0;
}

// The communicator's flat allgather and reduce_scatter, exactly: through shared memory when the
// driver starts the ranks (reduce_scatter of int64 still takes Gloo's path), through Gloo alone
// when each rank says it is alone on its host (LOCAL_WORLD_SIZE=1 under an external launcher).
int run_collectives(const Args& a) {
  Trainer trainer({.num_workers = a.workers}, {.storage_path = a.storage, .name = a.scenario});
  const auto result = trainer.fit([&](Trainer::context& ctx) {
    auto& comm = ctx.communicator();
    const int n = ctx.world_size(), r = ctx.world_rank();
    const std::int64_t piece = 5;
    bool ok = true;
    for (auto dtype : {torch::kFloat, torch::kInt64}) {
      auto in = torch::full({piece}, r + 1, dtype);
      auto out = torch::empty({piece * n}, dtype);
      comm.allgather(out, in).wait();
      for (int q = 0; q < n; ++q) ok = ok && out.narrow(0, q * piece, piece).eq(q + 1).all().item<bool>();
      // in[i] = (rank + 1) * i, so rank q's piece of the sum is n(n+1)/2 * i over its slice.
      auto flat = torch::arange(piece * n, dtype) * (r + 1);
      auto mine = torch::empty({piece}, dtype);
      comm.reduce_scatter(mine, flat, dtrain::reduce::sum).wait();
      const auto want = torch::arange(r * piece, (r + 1) * piece, dtype) * (n * (n + 1) / 2);
      ok = ok && torch::equal(mine, want);
    }
    auto flat = torch::ones({piece * n}) * (r + 1);
    auto mean = torch::empty({piece});
    comm.reduce_scatter(mean, flat, dtrain::reduce::mean).wait();
    ok = ok && mean.eq((n + 1) / 2.0).all().item<bool>();
    bool refused = false;
    try {
      auto wrong = torch::empty({piece + 1});
      comm.allgather(wrong, torch::ones({piece}));
    } catch (const dtrain::Error& e) {
      refused = std::string(e.what()).find("size() * piece.numel()") != std::string::npos;
    }
    // Under an external launcher only the workers run: a wrong result must show in the status.
    if (!ok || !refused) throw std::runtime_error("rank " + std::to_string(r) + ": a collective gave a wrong result");
    ctx.report({{"collectives_ok", ctx.all_reduce(1.0, dtrain::reduce::min)}});
  });
  std::cout << "RESULT collectives_ok=" << result.metrics.at("collectives_ok").text() << std::endl;
  return 0;
}

// Issue 33: a bare Gloo group of launched ranks (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, the run
// secret), made as backend::gloo makes it (its listeners restricted to the group's hosts) or, with
// --variant unguarded, as c10d makes it. Rank 1 arrives --rendezvous-ms late, so rank 0's listener
// waits that long for it (for tests/multihost/intruders.sh's stranger to find). Prints the sum, the
// milliseconds from making the group to its first allreduce's end, and those of each of --steps
// allreduces of --batch floats after it (benchmarks/gloo_peers.py).
int run_gloo_group(const Args& a) {
  const auto env = [](const char* name) { return std::string(std::getenv(name) ? std::getenv(name) : ""); };
  const int rank = std::stoi(env("RANK")), size = std::stoi(env("WORLD_SIZE")), port = std::stoi(env("MASTER_PORT"));
  const auto secret = dtrain::launch::run_secret_from_environment();
  const std::chrono::milliseconds timeout(20000);
  c10::intrusive_ptr<c10d::Store> store = rank == 0 ? dtrain::launch::Store::host(env("MASTER_ADDR"), port, secret, timeout)
                                                    : c10::make_intrusive<dtrain::launch::Store>(env("MASTER_ADDR"), port, secret, timeout);
  if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(a.rendezvous_ms));
  const auto device = [] { return c10d::ProcessGroupGloo::createDefaultDevice(); };
  const auto start = std::chrono::steady_clock::now();
  const auto ms_since = [](auto t) { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count(); };
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  if (a.variant == "unguarded") {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(device());
    group = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", store), rank, size, options);
  } else {
    group = dtrain::detail::guarded_gloo_group(store, "gloo", rank, size, timeout, 2, device);
  }
  std::vector<torch::Tensor> t{torch::full({4}, static_cast<float>(rank + 1))};
  group->allreduce(t)->wait();
  const double connect_ms = ms_since(start);
  std::vector<torch::Tensor> data{torch::ones({a.batch})};
  const auto steps_start = std::chrono::steady_clock::now();
  for (int i = 0; i < a.steps; ++i) group->allreduce(data)->wait();
  std::cout << "RESULT sum=" << t[0][0].item<float>() << " connect_ms=" << connect_ms
            << " allreduce_ms=" << ms_since(steps_start) / std::max(a.steps, 1) << std::endl;
  store->set("done/" + std::to_string(rank), std::vector<std::uint8_t>{1});
  for (int r = 0; r < size; ++r) store->get("done/" + std::to_string(r));  // rank 0's store outlives every client
  return 0;
}

// backend::gloo's hierarchical allreduce, run as launched ranks whose DTRAIN_HOST_ID splits them into
// hosts: float sums and means (one of 1.5M values: two rounds of the shared-memory slots) must equal,
// bit for bit, the sum of every rank's tensor in rank order (the one-host channel's order), and a
// max, a broadcast and an allgather (the flat Gloo group, checked through the hierarchy) their
// exact values. Rank 0 prints how many allreduces went through the hierarchy. With
// DTRAIN_HIERARCHICAL=0 (the flat Gloo group, its ring's order) the sums need only be within 1e-5.
int run_hierarchical(const Args& a) {
  Trainer trainer({.num_workers = a.workers}, {.storage_path = a.storage, .name = a.scenario});
  trainer.fit([&](Trainer::context& ctx) {
    auto& comm = ctx.communicator();
    const int n = ctx.world_size(), r = ctx.world_rank();
    auto of_rank = [](int q, std::int64_t size, torch::Dtype dtype) {
      return torch::randn({size}, torch::TensorOptions().dtype(dtype)
                                      .device(torch::kCPU)).mul_(q + 1).add_(torch::full({size}, 1.0 / (q + 3), dtype));
    };
    const char* off = std::getenv("DTRAIN_HIERARCHICAL");
    const bool in_rank_order = off == nullptr || std::string(off) != "0";
    bool ok = true;
    for (const std::int64_t size : {std::int64_t{1}, std::int64_t{1000003}, std::int64_t{1500000}}) {
      for (auto dtype : {torch::kFloat, torch::kDouble}) {
        for (auto op : {dtrain::reduce::sum, dtrain::reduce::mean}) {
          torch::manual_seed(11);
          std::vector<torch::Tensor> xs;
          for (int q = 0; q < n; ++q) xs.push_back(of_rank(q, size, dtype));
          auto want = xs[0].clone();
          for (int q = 1; q < n; ++q) want.add_(xs[q]);
          if (op == dtrain::reduce::mean) want.mul_(dtype == torch::kFloat ? double(1.0f / float(n)) : 1.0 / n);
          auto t = xs[r].clone();
          comm.allreduce(t, op).wait();
          ok = ok && (in_rank_order ? torch::equal(t, want) : torch::allclose(t, want, 1e-5, 1e-5));
        }
      }
    }
    auto m = torch::full({3}, double(r));
    comm.allreduce(m, dtrain::reduce::max).wait();
    ok = ok && m.eq(n - 1).all().item<bool>();
    auto b = torch::full({4}, double(r));
    comm.broadcast(b, n - 1).wait();
    ok = ok && b.eq(n - 1).all().item<bool>();
    auto g = torch::empty({2 * n}, torch::kInt64);
    comm.allgather(g, torch::full({2}, r, torch::kInt64)).wait();
    ok = ok && torch::equal(g, torch::arange(n, torch::kInt64).repeat_interleave(2));
    ok = ok && ctx.all_reduce(1.0, dtrain::reduce::sum) == n;
    if (!ok) throw std::runtime_error("rank " + std::to_string(r) + ": a hierarchical collective gave a wrong result");
    const auto through = comm.hierarchical_allreduces();
    const double fewest = ctx.all_reduce(static_cast<double>(through), dtrain::reduce::min);
    if (r == 0) std::cout << "HIERARCHICAL ok allreduces=" << through << " fewest=" << fewest << std::endl;
    ctx.report({{"hierarchical_allreduces", fewest}});
  });
  return 0;
}

// The CPU stand-in for backend::nccl's cuda_transfer: a backend with a batch_transfer makes
// ctx.shard() prefetch, which this exercises without a GPU.
struct cpu_transfer {
  explicit cpu_transfer(torch::Device) {}
  dtrain::data::Batch start(dtrain::data::Batch b) const { return b; }
  dtrain::data::Batch finish(dtrain::data::Batch b) const { return b; }
};
struct prefetching_gloo : dtrain::backend::gloo {
  using batch_transfer = cpu_transfer;
};
using PrefetchTrainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset, prefetching_gloo>;

// Evaluation across workers: one fixed model (the same weights on every rank and in every run)
// predicts 1001 samples (an uneven split) with a Predictor, gathered in order, while a confusion
// matrix is accumulated per batch on each rank and summed over the ranks; and a hand-computed case
// of 10 samples (truth i % 3, prediction (i / 2) % 3) split the same way. --out gets rank 0's
// gathered probabilities; the RESULT line the matrices and their summaries.
template <class T>
int evaluate(T& trainer, const Args& a, const dtrain::data::TensorDataset& data, std::int64_t features,
             std::int64_t hidden) {
  const dtrain::data::TensorDataset subset{data.data().narrow(0, 0, 1001), data.targets().narrow(0, 0, 1001)};
  auto table = [](const dtrain::evaluation::ConfusionMatrix& cm) {
    std::string s;
    for (const auto& row : cm.counts_table())
      for (auto v : row) s += (s.empty() ? "" : ",") + std::to_string(v);
    return s;
  };
  const auto result = trainer.fit([&](typename T::context& ctx) {
    torch::manual_seed(3);
    dtrain::evaluation::Predictor<torch::nn::Sequential> predictor(small_model(features, hidden));
    dtrain::evaluation::ConfusionMatrix cm(10);
    const auto predictions = predictor.predict(ctx, subset, a.batch, &cm);
    dtrain::evaluation::ConfusionMatrix hand(3);
    const auto mine = dtrain::sampler::sequential::indices(10, ctx.world_rank(), ctx.world_size(), 0);
    if (!mine.empty()) {
      const auto i = torch::tensor(mine);
      hand.update(torch::floor_divide(i, 2).remainder(3), i.remainder(3));  // (predictions, targets)
    }
    ctx.all_reduce(hand);
    if (ctx.world_rank() == 0 && !a.out.empty()) torch::save(predictions.probabilities(), a.out);
    dtrain::Metrics m = cm.summary("eval_");
    for (const auto& [k, v] : hand.summary("hand_")) m.emplace(k, v);
    m.emplace("cm", table(cm));
    m.emplace("hand_cm", table(hand));
    m.emplace("predicted", predictions.size());
    m.emplace("predicted_equals_cm", predictions.classes().eq(subset.targets()).sum().template item<std::int64_t>() ==
                                         static_cast<std::int64_t>(std::llround(cm.accuracy() * 1001)));
    m.emplace("label0", predictions[0].label);
    ctx.report(m);
  });
  std::cout << "RESULT";
  for (const auto& [k, v] : result.metrics) std::cout << ' ' << k << '=' << v.text();
  std::cout << std::endl;
  return 0;
}

template <class Trainer>
int run(const Args& a) {
  const bool big = a.scenario == "overlap";
  const std::int64_t features = big ? 512 : 20, hidden = big ? 512 : 32;
  const auto data = synthetic(1024, features);

  dtrain::RunConfig run_config{.storage_path = a.storage, .name = a.scenario,
                               .rendezvous_timeout = std::chrono::milliseconds(a.rendezvous_ms),
                               .collective_timeout = std::chrono::seconds(20)};
  if (a.scenario.rfind("sigstop", 0) == 0) {  // a stopped rank is found by its heartbeat, then restarted
    run_config.failure.max_failures = 1;
    run_config.failure.heartbeat_timeout = std::chrono::seconds(2);
  }
  // stuck, stuck_all: a training thread blocks for good while its heartbeat thread beats on, found
  // by the progress timeout, then restarted; slow_step: slow steps, shorter than it, which must not be.
  if (a.scenario.rfind("stuck", 0) == 0 || a.scenario == "slow_step") {
    run_config.failure.max_failures = 1;
    run_config.failure.progress_timeout = std::chrono::seconds(3);
    run_config.failure.stop_grace = std::chrono::seconds(1);
  }
  // skip_report_midway: rank 0 reports at step 2, rank 1 trains on; found from the ranks'
  // collective counts, with the default timeout (the issue: it waited all of its 300 s).
  if (a.scenario == "skip_report_midway") run_config.collective_timeout = dtrain::RunConfig{}.collective_timeout;
  Trainer trainer({.num_workers = a.workers, .threads_per_worker = a.threads}, run_config);
  if (a.scenario == "evaluate") return evaluate(trainer, a, data, features, hidden);
  const auto result = trainer.fit([&](typename Trainer::context& ctx) {
    torch::manual_seed(ctx.world_rank() + 7);  // different initial weights: prepare_model must fix that
    auto model = ctx.prepare_model(small_model(features, hidden));
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    int step = 0;
    for (auto epoch : ctx.epochs(1000)) {
      (void)epoch;
      for (auto batch : ctx.shard(data, a.batch)) {
        if (step == a.steps) break;
        // The position a checkpoint saves counts the batches the loop trained: not the one in
        // hand (not trained yet), nor the next one read ahead.
        if ((a.scenario == "prefetch" || a.scenario == "equivalence") && ctx.sampler_position() != step)
          throw std::runtime_error("sampler position " + std::to_string(ctx.sampler_position()) + " at batch " +
                                   std::to_string(step));
        if (a.scenario == "throw" && ctx.world_rank() == 1 && step == 3)
          throw std::runtime_error("boom at step 3");
        if (a.scenario == "sigkill" && ctx.world_rank() == 1 && step == 3) std::raise(SIGKILL);
        if (a.scenario == "hang") std::this_thread::sleep_for(std::chrono::hours(1));
        // sigstop: rank 1 stops itself inside the loop (the others then wait in the step's
        // allreduce); sigstop_report: after the loop, before its report. First attempt only.
        if (a.scenario == "sigstop" && ctx.world_rank() == 1 && step == 3 && ctx.attempt() == 0) std::raise(SIGSTOP);
        // stuck: rank 1's training thread sleeps for good at step 3 (the others wait in the step's
        // allreduce); stuck_all: every rank's, so none waits. First attempt only.
        if (step == 3 && ctx.attempt() == 0 &&
            ((a.scenario == "stuck" && ctx.world_rank() == 1) || a.scenario == "stuck_all")) {
          const auto now = std::chrono::system_clock::now().time_since_epoch();
          std::fprintf(stderr, "STUCK rank %d at %.3f\n", ctx.world_rank(), std::chrono::duration<double>(now).count());
          std::this_thread::sleep_for(std::chrono::hours(1));
        }
        // slow_step: rank 1 alone (the others wait for it), then every rank, slower than usual but
        // within the 3 s progress timeout.
        if (a.scenario == "slow_step" && ((step == 2 && ctx.world_rank() == 1) || step == 4))
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        if (a.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.step_ms));
        sgd.zero_grad();
        torch::Tensor loss;
        {
          auto autocast = ctx.autocast();
          loss = torch::nn::functional::cross_entropy(model->forward(batch.data).to(torch::kFloat), batch.target);
        }
        if (a.scenario == "no_sync" && step % 2 == 0) {
          auto guard = ctx.no_sync();
          ctx.backward(loss);
        } else if (a.scenario != "no_backward") {  // no_backward: the loop forgot it
          ctx.backward(loss);
        }
        // amp_overflow: rank 1 alone finds an inf in its (already averaged) gradients at step 2;
        // every rank must skip that step, so the parameters stay equal.
        if (a.scenario == "amp_overflow" && ctx.world_rank() == 1 && step == 2)
          model->parameters()[0].mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
        if (a.scenario != "no_sync" || step % 2 == 1) ctx.step(sgd);
        if (a.scenario == "skip_report_midway" && step == 2 && ctx.world_rank() == 0) ctx.report({{"step", step}});
        ++step;
      }
      if (step == a.steps) break;
    }
    if (a.scenario == "skip_report" && ctx.world_rank() == 1) return;
    const double sum = ctx.all_reduce(ctx.world_rank() + 1.0, dtrain::reduce::sum);
    const double mean = ctx.all_reduce(ctx.world_rank() + 1.0, dtrain::reduce::mean);
    const double max = ctx.all_reduce(ctx.world_rank() + 1.0, dtrain::reduce::max);
    const auto& stats = ctx.strategy().stats();
    // Every rank must hold the same parameters: compare each rank's checksum with rank 0's.
    double checksum = 0;
    for (const torch::Tensor& p : model->parameters()) checksum += p.sum().item<double>();
    const double checksum_max = ctx.all_reduce(checksum, dtrain::reduce::max);
    const double checksum_min = ctx.all_reduce(checksum, dtrain::reduce::min);
    if (ctx.world_rank() == 0 && !a.out.empty()) {
      std::vector<torch::Tensor> params;
      for (const auto& p : model->parameters()) params.push_back(p.detach().clone());
      torch::save(params, a.out);
    }
    const dtrain::Metrics metrics{{"rank", ctx.world_rank()},
                {"sum", sum}, {"mean", mean}, {"max", max},
                {"buckets", stats.buckets},
                {"grads_pending_at_first_launch", stats.grads_pending_at_first_launch},
                {"synced_steps", stats.synced_steps},
                {"ranks_agree", checksum_max == checksum_min},
                {"world", ctx.world_size()},
                {"skipped_min", ctx.all_reduce(static_cast<double>(ctx.skipped_steps()), dtrain::reduce::min)},
                {"skipped_max", ctx.all_reduce(static_cast<double>(ctx.skipped_steps()), dtrain::reduce::max)}};
    if (a.scenario == "sigstop_report" && ctx.world_rank() == 1 && ctx.attempt() == 0) std::raise(SIGSTOP);
    ctx.report(metrics);
  });
  std::cout << "RESULT";
  for (const auto& [k, v] : result.metrics) std::cout << ' ' << k << '=' << v.text();
  std::cout << " rows=" << result.metrics_history.size() << " restarts=" << result.restarts
            << " path=" << result.path.string() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  if (a.scenario == "collectives") return run_collectives(a);
  if (a.scenario == "mismatch") return run_mismatch(a);
  if (a.scenario == "graphed_on_cpu") return run_graphed_on_cpu(a);
  if (a.scenario == "hierarchical") return run_hierarchical(a);
  if (a.scenario == "gloo_group") return run_gloo_group(a);
  if (a.scenario == "embedding")
    return a.strategy == "fsdp" ? run_embedding<dtrain::Trainer<Bag, dtrain::data::TensorDataset, dtrain::strategy::fsdp<>>>(a)
                                : run_embedding<dtrain::Trainer<Bag, dtrain::data::TensorDataset>>(a);
  if (a.scenario.rfind("fsdp_", 0) == 0) {
    if (a.scenario == "fsdp_bad_optimizer" || a.strategy == "fsdp") return run_sharded<FsdpTrainer>(a);
    if (a.strategy == "fsdp_grad_op") return run_sharded<FsdpGradOpTrainer>(a);
    if (a.strategy == "ddp") return run_sharded<DdpTrainer>(a);
    throw std::invalid_argument("--strategy must be ddp, fsdp or fsdp_grad_op");
  }
  if (a.scenario.rfind("amp_", 0) == 0) return run<ScaledTrainer>(a);
  if (a.scenario == "prefetch") return run<PrefetchTrainer>(a);
  return run<Trainer>(a);
} catch (const std::exception& e) {  // dtrain's errors, and Gloo's in the bare gloo_group
  std::cout << "ERROR " << e.what() << std::endl;
  return 3;
}
