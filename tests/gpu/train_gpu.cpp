// SPDX-License-Identifier: Apache-2.0
// dtrain on GPUs end to end, and the dtrain half of the GPU benchmark (benchmarks/gpu_vs_torch.py
// runs it beside the same loop in Python torch). A Trainer over backend::nccl with DDP, the
// prefetching input pipeline and amp<fp16> (or fp32, or amp<bf16>) trains one of two models on
// synthetic data and prints one JSON line:
//   cnn          the Fashion-MNIST CNN on a Fashion-MNIST-shaped set (60 000 1x28x28 images)
//   transformer  one pre-norm transformer block as a language model: token and position
//                embeddings, attention (scaled_dot_product_attention), a 4x MLP with GELU, a
//                vocabulary head; random token sequences
//
//   train_gpu [--model cnn|transformer] [--precision fp16|bf16|fp32] [--workers N] [--steps S]
//             [--warmup W] [--batch B] [--d-model D] [--heads H] [--seq S] [--vocab V]
//             [--launched UNIX_SECONDS]   startup_s counts from then (default: this process's start)
//   train_gpu --model cnn --epochs E --samples N --name RUN [--save FILE]
//             checkpointed run: checkpoint_* after every epoch, resumes from the newest one, and
//             --save writes rank 0's final parameters (tests/gpu: resumed bitwise)
//   train_gpu ... --graph 1     the step captured in a CUDA graph (ctx.graphed_step; one worker)
//   train_gpu --model cnn --epochs E ... [--optimizer sgd|adamw] [--lr-decay F]
//             the checkpointed run with AdamW instead of SGD, and the learning rate times F at each
//             epoch (tests/gpu: graphed steps against ordinary ones)
//   train_gpu ... --plain 1     the same loop in plain LibTorch C++, without the Trainer (one GPU)
//   train_gpu ... --profile FILE --profile-steps P
//             after the timed steps, P more steps (default 5) under LibTorch's Kineto profiler
//             (CPU ops and CUDA kernels); FILE gets its Chrome trace (rank 0's), as Python's
//             torch.profiler writes it, for benchmarks/gpu_vs_torch.py --profile to compare
//   train_gpu --compare FILE_A FILE_B    exit 0 when the two saved parameter sets are bitwise equal
//   train_gpu --compare-close FILE_A FILE_B TOL    ... when they differ by at most TOL

#include <dtrain/all.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

namespace {

struct Args {
  std::string model = "cnn", precision = "fp16", name = "train_gpu", save, profile, optimizer = "sgd";
  int workers = 1, steps = 300, warmup = 30, epochs = 0, profile_steps = 5;
  bool plain = false, graph = false;
  double lr_decay = 1;
  std::int64_t batch = 256;  // per worker
  std::int64_t samples = 60000, d_model = 2048, heads = 16, seq = 1024, vocab = 8192;
};

// Kineto (CPU ops and CUDA kernels) from start() to save(); nothing when `path` is empty.
class Trace {
 public:
  explicit Trace(std::string path) : path_(std::move(path)) {}
  void start() {
    if (path_.empty()) return;
    torch::autograd::profiler::prepareProfiler(config(), activities());
    torch::autograd::profiler::enableProfiler(config(), activities());
  }
  void save() {
    if (path_.empty()) return;
    c10::cuda::device_synchronize();
    torch::autograd::profiler::disableProfiler()->save(path_);
  }

 private:
  static torch::profiler::impl::ProfilerConfig config() {
    return torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO);
  }
  static std::set<torch::profiler::impl::ActivityType> activities() {
    return {torch::profiler::impl::ActivityType::CPU, torch::profiler::impl::ActivityType::CUDA};
  }
  std::string path_;
};

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

torch::nn::Sequential cnn() {
  using namespace torch::nn;
  return Sequential(Conv2d(Conv2dOptions(1, 32, 3).padding(1)), ReLU(), MaxPool2d(2),
                    Conv2d(Conv2dOptions(32, 64, 3).padding(1)), ReLU(), MaxPool2d(2), Flatten(),
                    Linear(64 * 7 * 7, 128), ReLU(), Linear(128, 10));
}

// ATen's linear, as Python's nn.Linear calls it. LibTorch's C++ torch::nn::Linear (its functional
// F::linear) computes an input of more than two dimensions as matmul and then `+= bias`: a separate
// elementwise pass over every output (1.9 ms of the 17.9 ms step on an H200, 11 %), where ATen's
// linear folds the bias into the matrix product's epilogue (profiled with --profile).
torch::Tensor linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return at::linear(x, layer->weight, layer->bias);
}

// One pre-norm transformer block with embeddings and a vocabulary head; logits [B, S, vocab].
struct BlockLMImpl : torch::nn::Module {
  BlockLMImpl(const Args& a)
      : heads(a.heads), tok(register_module("tok", torch::nn::Embedding(a.vocab, a.d_model))),
        pos(register_module("pos", torch::nn::Embedding(a.seq, a.d_model))),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({a.d_model})))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({a.d_model})))),
        lnf(register_module("lnf", torch::nn::LayerNorm(torch::nn::LayerNormOptions({a.d_model})))),
        qkv(register_module("qkv", torch::nn::Linear(a.d_model, 3 * a.d_model))),
        proj(register_module("proj", torch::nn::Linear(a.d_model, a.d_model))),
        fc1(register_module("fc1", torch::nn::Linear(a.d_model, 4 * a.d_model))),
        fc2(register_module("fc2", torch::nn::Linear(4 * a.d_model, a.d_model))),
        head(register_module("head", torch::nn::Linear(a.d_model, a.vocab))) {}

  torch::Tensor forward(const torch::Tensor& tokens) {
    const auto b = tokens.size(0), s = tokens.size(1), d = tok->weight.size(1);
    auto h = tok(tokens) + pos->weight.narrow(0, 0, s);
    // unbind, as Python's `q, k, v = ...` does: its backward is one stack, where three selects
    // would each fill a zero tensor of the whole qkv gradient and then be summed.
    auto q_k_v = linear(qkv, ln1(h)).view({b, s, 3, heads, d / heads}).permute({2, 0, 3, 1, 4}).unbind(0);
    auto att = at::scaled_dot_product_attention(q_k_v[0], q_k_v[1], q_k_v[2]);
    h = h + linear(proj, att.transpose(1, 2).reshape({b, s, d}));
    h = h + linear(fc2, torch::gelu(linear(fc1, ln2(h))));
    return linear(head, lnf(h));
  }

  std::int64_t heads;
  torch::nn::Embedding tok, pos;
  torch::nn::LayerNorm ln1, ln2, lnf;
  torch::nn::Linear qkv, proj, fc1, fc2, head;
};
TORCH_MODULE(BlockLM);

// 1x28x28 floats in [0, 1] and labels 0..9, as Fashion-MNIST has them.
dtrain::data::TensorDataset images(std::int64_t n) {
  auto gen = at::detail::createCPUGenerator(99);
  return {at::rand({n, 1, 28, 28}, gen), at::randint(0, 10, {n}, gen)};
}
// Random token sequences; the target is the next token.
dtrain::data::TensorDataset sequences(const Args& a) {
  auto gen = at::detail::createCPUGenerator(99);
  auto tokens = at::randint(0, a.vocab, {a.samples, a.seq + 1}, gen);
  return {tokens.narrow(1, 0, a.seq).contiguous(), tokens.narrow(1, 1, a.seq).contiguous()};
}

// Python's F.cross_entropy(logits.float(), y), without an fp32 copy of the logits (nn/loss.hpp).
torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& target) {
  return dtrain::nn::cross_entropy_fp32(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
}

// --graph 1: the step captured by ctx.graphed_step, whose static_assert refuses amp<fp16> (its loss
// scaling decides on the host whether to skip a step); here a flag, so refused at run time.
template <class Precision, class Graphed, class... Args>
void make_graphed(std::optional<Graphed>& graphed, bool wanted, Args&&... args) {
  if (!wanted) return;
  if constexpr (!std::is_same_v<Precision, dtrain::precision::amp<dtrain::precision::fp16>>)
    graphed.emplace(std::forward<Args>(args)...);
  else
    throw std::invalid_argument("--graph 1 takes --precision bf16 or fp32 (amp<fp16>'s loss scaling is not captured)");
}

// The timed loop: `warmup` steps, then `steps` timed ones with the device synchronised at both ends.
template <class Model, class Precision, class Make>
int benchmark(const Args& a, Make make_model, const dtrain::data::TensorDataset& data, double launched) {
  using Trainer = dtrain::Trainer<Model, dtrain::data::TensorDataset, dtrain::backend::nccl, Precision>;
  Trainer trainer({.num_workers = a.workers}, {.storage_path = "gpu_runs", .name = a.name});
  const auto result = trainer.fit([&](typename Trainer::context& ctx) {
    torch::manual_seed(1);
    auto model = ctx.prepare_model(make_model());
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    auto forward = [&](const torch::Tensor& x, const torch::Tensor& y) {
      auto autocast = ctx.autocast();
      return loss_of(model->forward(x), y);
    };
    std::optional<dtrain::GraphedStep<typename Trainer::context, torch::optim::SGD, decltype(forward)>> graphed;
    make_graphed<Precision>(graphed, a.graph, ctx, sgd, forward, dtrain::GraphOptions{});
    int step = 0;
    double first_step_done = 0, seconds = 0;
    auto t0 = std::chrono::steady_clock::now();
    torch::Tensor loss;
    Trace trace(ctx.world_rank() == 0 ? a.profile : std::string());
    const int last = a.warmup + a.steps + (a.profile.empty() ? 0 : a.profile_steps);
    for (auto epoch : ctx.epochs(1000)) {
      (void)epoch;
      for (const auto& batch : ctx.shard(data, a.batch * ctx.world_size())) {
        if (step == a.warmup) {
          c10::cuda::device_synchronize();
          t0 = std::chrono::steady_clock::now();
        }
        if (step == a.warmup + a.steps) {
          c10::cuda::device_synchronize();
          seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          trace.start();
        }
        if (step == last) break;
        if (graphed) {
          loss = (*graphed)(batch.data, batch.target);
        } else {
          sgd.zero_grad();
          loss = forward(batch.data, batch.target);
          ctx.backward(loss);
          ctx.step(sgd);
        }
        if (++step == 1) {
          c10::cuda::device_synchronize();
          first_step_done = unix_seconds();
        }
      }
      if (step == last) break;
    }
    trace.save();
    // AGGREGATE is the first entry of each statistic's array in every LibTorch version.
    const auto mem = c10::cuda::CUDACachingAllocator::getDeviceStats(ctx.device().index());
    ctx.report({{"steps_per_s", a.steps / seconds},
                {"samples_per_s", a.steps * a.batch * ctx.world_size() / seconds},
                {"loss", loss.template item<double>()},
                {"skipped", ctx.skipped_steps()},
                {"startup_s", first_step_done - launched},
                {"peak_allocated_mib", mem.allocated_bytes[0].peak / 1048576.0},
                {"peak_reserved_mib", mem.reserved_bytes[0].peak / 1048576.0},
                {"allreduce_wait_s", ctx.strategy().stats().allreduce_wait_s},
                {"replays", graphed ? graphed->replays() : 0}});
  });
  std::cout << "{\"impl\": \"dtrain\", \"model\": \"" << a.model << "\", \"precision\": \"" << a.precision
            << "\", \"workers\": " << a.workers << ", \"batch_per_worker\": " << a.batch << ", \"steps\": " << a.steps;
  for (const auto& key : {"steps_per_s", "samples_per_s", "loss", "skipped", "startup_s", "peak_allocated_mib",
                          "peak_reserved_mib", "allreduce_wait_s", "replays"})
    std::cout << ", \"" << key << "\": " << result.metrics.at(key).text();
  std::cout << "}" << std::endl;
  return 0;
}

// The same loop in plain LibTorch C++, without the Trainer (no worker process, DDP, prefetcher):
// what dtrain's machinery costs, apart from LibTorch's C++ API against Python's.
template <class Precision, class Model, class Make>
int plain(const Args& a, Make make_model, const dtrain::data::TensorDataset& data) {
  const torch::Device dev(torch::kCUDA, 0);
  torch::manual_seed(1);
  Model model = make_model();
  model->to(dev);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  typename Precision::state precision(dev);
  auto gen = at::detail::createCPUGenerator(7);
  torch::Tensor loss;
  auto t0 = std::chrono::steady_clock::now();
  double seconds = 0;
  Trace trace(a.profile);
  const int last = a.warmup + a.steps + (a.profile.empty() ? 0 : a.profile_steps);
  for (int step = 0; step < last; ++step) {
    if (step == a.warmup) {
      c10::cuda::device_synchronize();
      t0 = std::chrono::steady_clock::now();
    }
    if (step == a.warmup + a.steps) {
      c10::cuda::device_synchronize();
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      trace.start();
    }
    const auto idx = at::randint(0, data.size(), {a.batch}, gen);
    auto b = data.get_batch(idx);
    const auto x = b.data.pin_memory().to(dev, true), y = b.target.pin_memory().to(dev, true);
    sgd.zero_grad();
    {
      auto autocast = precision.autocast();
      loss = loss_of(model->forward(x), y);
    }
    precision.backward(loss);
    precision.step(sgd);
  }
  if (last == a.warmup + a.steps) {
    c10::cuda::device_synchronize();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  trace.save();
  std::cout << "{\"impl\": \"libtorch\", \"model\": \"" << a.model << "\", \"precision\": \"" << a.precision
            << "\", \"samples_per_s\": " << a.steps * a.batch / seconds << ", \"loss\": " << loss.item<double>() << "}"
            << std::endl;
  return 0;
}

// Checkpointed training over whole epochs: resumes from the run's newest checkpoint, so a run
// stopped after some epochs and started again ends where an uninterrupted one does. With --graph 1
// the steps are captured (the checkpoint after each epoch renews the optimizer's state, so each
// epoch captures again; an epoch's smaller last batch steps outside the graph).
template <class Precision, class Optimizer>
int checkpointed(const Args& a, std::function<Optimizer(std::vector<torch::Tensor>)> make_optimizer) {
  using Trainer = dtrain::Trainer<torch::nn::Sequential, dtrain::data::TensorDataset, dtrain::backend::nccl,
                                  Precision, dtrain::checkpointer::directory<>>;
  const auto data = images(a.samples);
  Trainer trainer({.num_workers = a.workers}, {.storage_path = "gpu_runs", .name = a.name});
  const auto result = trainer.fit([&](typename Trainer::context& ctx) {
    // Deterministic cuDNN kernels, so that two runs compute the same bits.
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setBenchmarkCuDNN(false);
    torch::manual_seed(1);
    auto model = ctx.prepare_model(cnn());
    auto opt = make_optimizer(model->parameters());
    const double base_lr = opt.param_groups().front().options().get_lr();
    if (auto ck = ctx.get_checkpoint()) ctx.restore(*ck, model, opt);
    auto forward = [&](const torch::Tensor& x, const torch::Tensor& y) {
      auto autocast = ctx.autocast();
      return loss_of(model->forward(x), y);
    };
    std::optional<dtrain::GraphedStep<typename Trainer::context, Optimizer, decltype(forward)>> graphed;
    make_graphed<Precision>(graphed, a.graph, ctx, opt, forward, dtrain::GraphOptions{});
    int epochs_run = 0;  // in this run: fewer than a.epochs when it resumed
    for (auto epoch : ctx.epochs(a.epochs)) {
      ++epochs_run;
      for (auto& group : opt.param_groups()) group.options().set_lr(base_lr * std::pow(a.lr_decay, epoch));
      for (const auto& batch : ctx.shard(data, a.batch * ctx.world_size())) {
        if (graphed) {
          (*graphed)(batch.data, batch.target);
          continue;
        }
        opt.zero_grad();
        auto loss = forward(batch.data, batch.target);
        ctx.backward(loss);
        ctx.step(opt);
      }
      ctx.report({{"epoch", epoch},
                  {"epochs_run", epochs_run},
                  {"replays", graphed ? graphed->replays() : 0},
                  {"captures", graphed ? graphed->captures() : 0},
                  {"eager_steps", graphed ? graphed->eager_steps() : 0},
                  {"steps", ctx.steps()}},
                 ctx.checkpoint(model, opt));
    }
    if (ctx.world_rank() == 0 && !a.save.empty()) {
      std::vector<torch::Tensor> params;
      for (const auto& p : model->parameters()) {
        if (!p.is_cuda()) throw std::runtime_error("a parameter is not on the GPU");
        params.push_back(p.detach().cpu());
      }
      torch::save(params, a.save);
    }
  });
  std::cout << "{\"impl\": \"dtrain\", \"checkpointed\": \"" << a.name << "\", \"epochs\": " << a.epochs;
  for (const auto& key : {"replays", "captures", "eager_steps", "steps"})
    std::cout << ", \"" << key << "\": " << result.metrics.at(key).text();
  std::cout << ", \"epochs_run\": " << result.metrics.at("epochs_run").text() << "}" << std::endl;
  return 0;
}

template <class Precision>
int checkpointed(const Args& a) {
  if (a.optimizer == "sgd")
    return checkpointed<Precision, torch::optim::SGD>(
        a, [](std::vector<torch::Tensor> ps) { return torch::optim::SGD(ps, torch::optim::SGDOptions(0.05).momentum(0.9)); });
  if (a.optimizer == "adamw")
    return checkpointed<Precision, torch::optim::AdamW>(
        a, [](std::vector<torch::Tensor> ps) { return torch::optim::AdamW(ps, torch::optim::AdamWOptions(1e-3)); });
  throw std::invalid_argument("--optimizer must be sgd or adamw, got " + a.optimizer);
}

int compare(const std::string& file_a, const std::string& file_b, double tolerance = 0) {
  std::vector<torch::Tensor> pa, pb;
  torch::load(pa, file_a);
  torch::load(pb, file_b);
  if (pa.size() != pb.size() || pa.empty()) {
    std::cerr << "train_gpu: " << file_a << " holds " << pa.size() << " tensors, " << file_b << " " << pb.size() << "\n";
    return 1;
  }
  for (std::size_t i = 0; i < pa.size(); ++i)
    if (tolerance == 0 ? !torch::equal(pa[i], pb[i]) : (pa[i] - pb[i]).abs().max().item<double>() > tolerance) {
      std::cerr << "train_gpu: parameter " << i << " differs; largest difference "
                << (pa[i] - pb[i]).abs().max().item<double>() << "\n";
      return 1;
    }
  double largest = 0;
  for (std::size_t i = 0; i < pa.size(); ++i) largest = std::max(largest, (pa[i] - pb[i]).abs().max().item<double>());
  std::cout << "{\"" << (tolerance == 0 ? "bitwise_equal" : "close") << "\": true, \"tensors\": " << pa.size()
            << ", \"largest_difference\": " << largest << "}" << std::endl;
  return 0;
}

template <class Precision>
int run(const Args& a, double launched) {
  if (a.epochs > 0) return checkpointed<Precision>(a);
  if (a.plain && a.model == "cnn") return plain<Precision, torch::nn::Sequential>(a, cnn, images(a.samples));
  if (a.plain && a.model == "transformer") return plain<Precision, BlockLM>(a, [&] { return BlockLM(a); }, sequences(a));
  if (a.model == "cnn") return benchmark<torch::nn::Sequential, Precision>(a, cnn, images(a.samples), launched);
  if (a.model == "transformer")
    return benchmark<BlockLM, Precision>(a, [&] { return BlockLM(a); }, sequences(a), launched);
  throw std::invalid_argument("--model must be cnn or transformer, got " + a.model);
}

}  // namespace

int main(int argc, char** argv) try {
  double launched = unix_seconds();  // workers are exec'd with the same flags: --launched is the driver's
  Args a;
  bool sample_count_given = false;
  if (argc == 4 && std::string(argv[1]) == "--compare") return compare(argv[2], argv[3]);
  if (argc == 5 && std::string(argv[1]) == "--compare-close") return compare(argv[2], argv[3], std::stod(argv[4]));
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--model") a.model = v;
    else if (f == "--precision") a.precision = v;
    else if (f == "--workers") a.workers = std::stoi(v);
    else if (f == "--steps") a.steps = std::stoi(v);
    else if (f == "--warmup") a.warmup = std::stoi(v);
    else if (f == "--batch") a.batch = std::stoll(v);
    else if (f == "--epochs") a.epochs = std::stoi(v);
    else if (f == "--samples") a.samples = std::stoll(v), sample_count_given = true;
    else if (f == "--name") a.name = v;
    else if (f == "--save") a.save = v;
    else if (f == "--d-model") a.d_model = std::stoll(v);
    else if (f == "--heads") a.heads = std::stoll(v);
    else if (f == "--seq") a.seq = std::stoll(v);
    else if (f == "--vocab") a.vocab = std::stoll(v);
    else if (f == "--launched") launched = std::stod(v);
    else if (f == "--plain") a.plain = v == "1";
    else if (f == "--graph") a.graph = v == "1";
    else if (f == "--optimizer") a.optimizer = v;
    else if (f == "--lr-decay") a.lr_decay = std::stod(v);
    else if (f == "--profile") a.profile = v;
    else if (f == "--profile-steps") a.profile_steps = std::stoi(v);
    else throw std::invalid_argument("unknown flag " + f);
  }
  if (argc % 2 == 0) throw std::invalid_argument(std::string("flag ") + argv[argc - 1] + " has no value");
  if (a.model == "transformer" && !sample_count_given) a.samples = 512;
  if (a.model == "transformer" && a.d_model % a.heads != 0)
    throw std::invalid_argument("--d-model must be a multiple of --heads");
  if (a.precision == "fp16") return run<dtrain::precision::amp<dtrain::precision::fp16>>(a, launched);
  if (a.precision == "bf16") return run<dtrain::precision::amp<dtrain::precision::bf16>>(a, launched);
  if (a.precision == "fp32") return run<dtrain::precision::fp32>(a, launched);
  throw std::invalid_argument("--precision must be fp16, bf16 or fp32, got " + a.precision);
} catch (const std::exception& e) {
  std::cerr << "train_gpu: " << e.what() << std::endl;
  return 1;
}
