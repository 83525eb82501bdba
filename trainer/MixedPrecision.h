// Mixed precision the way production BERT trainers run it. The master model (fp32) holds the weights the
// optimizer updates, in its flat parameter groups with fp32 state. Forward and backward run on a compute
// copy in bf16 whose parameters are views of one flat buffer per optimizer group, laid out like the master
// buffers, so refresh() after each optimizer step is one cast per group. Each compute parameter's .grad()
// is the master's fp32 gradient view: autograd adds every bf16 gradient into it, so micro-batches
// accumulate in fp32 and the buckets, clipping and the optimizer all see fp32 gradients.
#pragma once
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "optimizers/Optimizer.h"
#include "trainer/BertModel.h"

namespace bs {

class ComputeCopy {
 public:
  // `master`'s parameters must already be views of `optimizer`'s flat buffers (make_optimizer does that).
  ComputeCopy(BertForPretraining& master, const optim::Optimizer& optimizer, torch::ScalarType dtype);

  BertForPretraining& model() { return copy_; }
  // Casts the fp32 masters into the compute copy: once after building and after every optimizer step.
  void refresh();
  // Bytes of the compute copy's flat buffers (what mixed precision adds to memory).
  int64_t bytes() const;

 private:
  BertForPretraining copy_{nullptr};
  std::vector<torch::Tensor> master_flat_, compute_flat_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> frozen_;  // (master, copy) of parameters not trained
};

}  // namespace bs
